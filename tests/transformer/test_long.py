"""The long view of attnlab's transformer equals its own full pattern (hook_pattern): every tile, row,
column and pooled cell, with grouped-query attention, sliding-window layers and softcapped scores."""

import numpy as np
import pytest

from attnlab.analysis import longview

pytestmark = pytest.mark.needs("torch")


def _model(**kw):
    import torch

    from attnlab.transformer.config import TransformerConfig
    from attnlab.transformer.model import Transformer

    torch.manual_seed(0)
    c = TransformerConfig(**{"vocab_size": 23, "d_model": 32, "num_layers": 3, "num_heads": 4, "num_kv_heads": 2,
                             "positions": "rotary", "norm": "rmsnorm", "ffn": "gated", "activation": "silu",
                             "max_positions": 64, "sliding_window": 5,
                             "layer_types": ("full_attention", "sliding_attention", "full_attention"), **kw})
    m = Transformer(c, backend="torch")
    for p in m.parameters():  # sharper than init, so that the maps are not uniform; scores stay below 16,
        p.data.mul_(1.5)  # where float32's step is 1e-6 and a float32 map's own rounding would pass the tolerance
    return m.eval()


@pytest.mark.parametrize("kw", [{}, {"attn_softcap": 2.0}], ids=["window", "softcap"])
def test_long_view_equals_the_models_pattern(kw):
    import torch

    from attnlab.transformer.long import capture_long

    m = _model(**kw)
    ids = torch.randint(0, 23, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        _, cache = m.run_with_cache(ids, names=lambda n: n.endswith("hook_pattern"))
    long = capture_long(m, ids)
    assert long.layers[1].window == (4, 0) and long.layers[0].window is None
    t = ids.shape[1]
    for layer in range(3):
        full = cache[f"blocks.{layer}.attn.hook_pattern"][0].float().numpy()  # (H, T, T)
        for head in range(4):
            f = full[head]
            np.testing.assert_allclose(longview.weights(long, layer, head, (0, t), (0, t)), f, rtol=0, atol=1e-6)
            np.testing.assert_allclose(longview.row(long, layer, head, t - 1), f[t - 1], rtol=0, atol=1e-6)
            np.testing.assert_allclose(longview.column(long, layer, head, 2), f[:, 2], rtol=0, atol=1e-6)
            ov = longview.overview(long, layer, head, cells=6)
            b = ov.block
            for r in range(ov.cells):
                want = [f[r * b:(r + 1) * b, c * b:(c + 1) * b].max() for c in range(ov.cells)]
                np.testing.assert_allclose(ov.max[r], want, rtol=0, atol=1e-6)


def test_more_tokens_than_positions_is_one_clear_error():
    from attnlab.transformer.long import capture_long

    with pytest.raises(ValueError, match="input_ids has 65 tokens; the model takes at most 64 .* at least 65 positions"):
        capture_long(_model(), np.zeros(65, dtype=int))


def test_the_maps_are_not_uniform():  # the check above would pass trivially on flat maps
    import torch

    from attnlab.transformer.long import capture_long

    long = capture_long(_model(), torch.arange(30) % 23)
    assert longview.row(long, 2, 1, 29).max() > 0.2


def test_a_softcapped_models_long_view_goes_through_the_kernel_and_holds_no_scores(monkeypatch):
    """The kernel softcaps inside its tiles: the LSE of a softcapped layer is the compiled pass's, as any other."""
    import torch

    from attnlab.backends import api
    from attnlab.transformer import long

    seen = []
    real = api.attention
    monkeypatch.setattr(api, "attention", lambda *a, **kw: seen.append((kw["backend"], kw["softcap"])) or real(*a, **kw))
    long.capture_long(_model(attn_softcap=2.0), torch.arange(20) % 23)
    assert seen and all(s == ("kernel", 2.0) for s in seen)


def test_learned_sinks_long_view_equals_the_models_pattern_and_keeps_the_sink_share(tmp_path):
    """gpt-oss's learned sinks: the LSE includes them, so every row and pooled cell equals hook_pattern (whose rows
    add up to less than 1), and the sink's share of each row is the rest; the file keeps the sink logits."""
    import torch

    import attnlab
    from attnlab.transformer.long import capture_long

    m = _model(attn_sinks=True)
    with torch.no_grad():
        for layer, block in enumerate(m.blocks):
            block.attn.sinks.copy_(torch.linspace(-1.0, 2.0, 4) + layer)
    ids = torch.randint(0, 23, (1, 33), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        _, cache = m.run_with_cache(ids, names=lambda n: n.endswith("hook_pattern"))
    long = capture_long(m, ids)
    assert long.sink_logits.shape == (3, 4)
    t = ids.shape[1]
    for layer in range(3):
        full = cache[f"blocks.{layer}.attn.hook_pattern"][0].float().numpy()  # (H, T, T)
        for head in range(4):
            f = full[head]
            share = longview.sink_share(long, layer, head)
            assert share.max() > 0.05  # the sink takes a visible share: rows do not add up to 1
            np.testing.assert_allclose(share, 1 - f.sum(-1), rtol=0, atol=2e-6)
            np.testing.assert_allclose(longview.row(long, layer, head, t - 1), f[t - 1], rtol=0, atol=1e-6)
            ov = longview.overview(long, layer, head, cells=5)
            b = ov.block
            for r in range(ov.cells):
                want = [f[r * b:(r + 1) * b, c * b:(c + 1) * b].max() for c in range(ov.cells)]
                np.testing.assert_allclose(ov.max[r], want, rtol=0, atol=1e-6)
                assert abs(ov.sink_share[r] - share[r * b:(r + 1) * b].mean()) < 1e-6
    from attnlab.web import longview as served  # what the server answers: the share beside the row and the overview

    assert served.row(long, 2, 3, t - 1, 3)["sink_share"] == float(longview.sink_share(long, 2, 3)[t - 1])
    assert served.overview(long, 2, 3, 5)["sink_share"] == served.floats(longview.overview(long, 2, 3, 5).sink_share)
    back = attnlab.load_maps(long.save(tmp_path / "sinks"))
    assert np.array_equal(back.sink_logits, long.sink_logits)
    assert longview.sink_share(capture_long(_model(), ids), 0, 0) is None  # no learned sinks: none
