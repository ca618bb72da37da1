"""head_stats of a model with learned sinks (a tiny random gpt-oss, tests/tiny_models.py) equals the same
statistics computed by hand from capture()'s dense weights and each row's sink share, by the sink share
rule of docs/design.md: the sink is one more outcome of the entropy (normalised by log(keys seen + 1)), the
other statistics take the weights as they are; both passes (compiled and PyTorch)."""

import numpy as np
import pytest

import attnlab
from attnlab.interventions import stats as stats_module
from attnlab.interventions.stats import ROW_STATS, head_stats

pytestmark = pytest.mark.needs("torch", "transformers")
TEXT = "The river runs past the bank, slowly! I put the money in the bank and sat on the bank of the river."


def _plogp(p):
    return p * np.log(np.where(p > 0, p, 1.0))


def _dense(w, share):
    """ROW_STATS, the sink share and the column sums from dense weights [L, H, T, T] and shares [L, H, T]."""
    w, share = w.astype(np.float64), share.astype(np.float64)
    t = w.shape[-1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    outcomes = (w > 0).sum(-1) + 1  # (L, H, T): the keys each row sees (window and causal), and the sink
    ent = -_plogp(w).sum(-1) - _plogp(share)
    return {
        "prev": np.diagonal(w, -1, -2, -1).mean(-1), "self": np.diagonal(w, 0, -2, -1).mean(-1),
        "next": np.diagonal(w, 1, -2, -1).mean(-1), "first": w[..., 0].mean(-1),
        "distance": (w * np.abs(i - j)).sum(-1).mean(-1), "entropy": ent.mean(-1),
        "entropy_norm": (ent / np.log(outcomes)).mean(-1), "sink_share": share.mean(-1),
    }, w.sum(-2)


@pytest.fixture(scope="module")
def oss(tiny_folder):
    return tiny_folder("gpt_oss")


@pytest.mark.parametrize("compiled", [True, False])
def test_head_stats_with_sinks_equal_the_dense_weights_and_shares(oss, compiled, monkeypatch):
    if compiled and stats_module.kernel.isa() is None:
        pytest.skip("the compiled kernel was not built here")
    if not compiled:  # the PyTorch pass, as a build without a C compiler takes
        monkeypatch.setattr(stats_module, "compiled_layer_stats", stats_module.layer_stats)
    found = head_stats(TEXT, str(oss), block_rows=7)
    maps = attnlab.capture([TEXT], str(oss))
    assert maps.tokens[0] == found.tokens[0]
    w, share = maps.weights[0], maps.self_attention.sink_share[0]
    assert share.max() > 0.1 and (w[0] == 0).any()  # sinks that matter, and layer 0's window hides keys
    want, received = _dense(w, share)
    for name in (*ROW_STATS, "sink_share"):
        np.testing.assert_allclose(found.means[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(found.received[0], received, rtol=1e-5, atol=1e-5)
    assert found.sink_share is found.means["sink_share"]
    assert found.to_dict()["means"]["sink_share"] == np.round(found.sink_share, 6).tolist()


@pytest.mark.needs("kernel")
def test_the_two_passes_agree_with_sinks():
    import torch

    from attnlab.interventions.stats import compiled_layer_stats, layer_stats

    h, hkv, t, d = 6, 2, 150, 32
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(h, t, d, generator=gen) * 1.5, torch.randn(hkv, t, d, generator=gen) * 1.5
    sinks = torch.tensor([-2.0, 0.0, 1.0, 3.0, 5.0, 0.5])
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    s = (q @ k.repeat_interleave(h // hkv, 0).transpose(-1, -2)).double() * d**-0.5
    s = s.masked_fill((j > i) | (j < i - 20), -torch.inf)
    lse = torch.logaddexp(torch.logsumexp(s, -1), sinks.double()[:, None]).float()
    kw = dict(scale=d**-0.5, causal=True, window=(20, 0), sinks=sinks)
    a, counts_a, received_a = layer_stats(q, k, lse, block_rows=37, **kw)
    b, counts_b, received_b = compiled_layer_stats(q, k, lse, **kw)
    assert counts_a == counts_b and counts_a["entropy_norm"] == t and counts_a["sink_share"] == t
    for name in (*ROW_STATS, "sink_share"):
        np.testing.assert_allclose(a[name], b[name], rtol=2e-6, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(received_a, received_b, rtol=2e-6, atol=1e-5)
    assert b["sink_share"][-1] / t > b["sink_share"][0] / t  # a larger logit, a larger share


def test_the_stats_command_shows_the_sink_share(oss, tmp_path, capsys):
    import json

    from attnlab.cli.app import main

    f = tmp_path / "long.txt"
    f.write_text(TEXT)
    assert main(["stats", str(f), "--model", str(oss), "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["means"]["sink_share"]) == 2 and len(out["means"]["sink_share"][0]) == 4
    assert main(["stats", str(f), "--model", str(oss)]) == 0
    assert "sink" in capsys.readouterr().out  # the "sink share" column (its title may wrap)
