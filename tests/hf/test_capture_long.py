"""The long view of a real model: its tiles, rows, columns and pooled cells equal capture()'s full map
(float32, 1e-6) for a causal Llama, a sliding-window Mistral and a bidirectional BERT; its file round-trips."""

import numpy as np
import pytest

import attnlab
from attnlab.analysis import longview
from attnlab.hf.capture import capture
from attnlab.hf.capture_long import capture_long
from attnlab.hf.loading import load_model
from attnlab.maps.long import LongMaps, MapTooLarge

TEXT = "The cat sat on the mat, and the dog sat on the log; then the cat saw the dog."  # 50 of the tiny models' 64


def _equal_everywhere(long, full, atol=1e-6):
    w = full.weights[0]  # [L, H, T, T]
    t = w.shape[-1]
    assert long.num_tokens == t and long.labels() == full.labels(0)
    for layer in range(long.num_layers):
        for head in range(long.num_heads):
            f = w[layer, head]
            np.testing.assert_allclose(longview.weights(long, layer, head, (0, t), (0, t)), f, rtol=0, atol=atol)
            for i in (0, t // 3, t - 1):
                np.testing.assert_allclose(longview.row(long, layer, head, i), f[i], rtol=0, atol=atol)
                np.testing.assert_allclose(longview.column(long, layer, head, i), f[:, i], rtol=0, atol=atol)
            ov = longview.overview(long, layer, head, cells=7)
            b = ov.block
            for r in range(ov.cells):
                cell = f[r * b:(r + 1) * b]
                means = [cell[:, c * b:(c + 1) * b].mean() for c in range(ov.cells)]
                np.testing.assert_allclose(ov.mean[r], means, rtol=0, atol=atol)


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_long_view_equals_the_full_map_of_a_decoder(tiny_folder, arch):
    lm = load_model(tiny_folder(arch))
    long = capture_long(TEXT, lm)
    assert long.keys.shape[1] < long.queries.shape[1]  # grouped keys kept once per k/v head
    if arch in ("mistral", "gemma2"):
        assert long.layers[0].window == (3, 0) and long.layers[0].causal
    if arch == "gemma2":  # softcapped scores: the kernel caps them in its tiles, the long view from the facts
        assert [f.softcap for f in long.layers] == [0.5, 0.5]
    _equal_everywhere(long, capture(TEXT, lm))


def test_long_view_equals_the_full_map_of_an_encoder(default_model):
    # MiniLM's scores reach 31, where one float32 step is 1.9e-6: the full map's own float32 softmax and
    # the kernel's float32 LSE each differ from float64 by a few of them (the synthetic test in
    # tests/analysis/test_longview.py holds the method itself to 1e-6), so this compares at 1e-5
    text = "I sat on the bank of the river, and the water ran past."
    long = capture_long(text, default_model)
    scores = np.einsum("htd,hsd->hts", long.queries[0], long.keys[0]) * long.layers[0].scale
    assert np.abs(scores).max() > 16  # where float32 spacing passes 1e-6
    _equal_everywhere(long, capture(text, default_model), atol=1e-5)


def test_long_maps_file_round_trips(tiny_llama, tmp_path):
    long = capture_long(TEXT, load_model(tiny_llama))
    back = attnlab.load_maps(long.save(tmp_path / "long"))
    assert isinstance(back, LongMaps)
    for name in ("queries", "keys", "lse"):
        assert np.array_equal(getattr(back, name), getattr(long, name))
    assert (back.layers, back.side, back.model_id, back.sentence) == (long.layers, long.side, long.model_id, long.sentence)


def test_full_capture_refuses_what_would_not_fit_before_running(tiny_llama, monkeypatch):
    lm = load_model(tiny_llama)
    monkeypatch.setattr(type(lm.model), "forward", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(MapTooLarge, match="would hold about .* of T × T attention weights, over the limit of 1.0 kB; "
                                          "take the long view"):
        capture(TEXT, lm, max_bytes=1000)


def test_text_longer_than_the_positions_is_one_clear_error(tiny_llama):
    lm = load_model(tiny_llama)
    words = " ".join(["word"] * (lm.max_tokens + 10))
    for run in (lambda: capture_long(words, lm), lambda: capture(words, lm)):
        with pytest.raises(ValueError, match=rf"has \d+ tokens; model .* takes at most {lm.max_tokens} "):
            run()


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_an_encoder_decoder_is_refused_naming_why(tiny_folder, arch):
    lm = load_model(tiny_folder(arch))
    with pytest.raises(ValueError, match=r"is an encoder–decoder \(two sequences joined by cross-attention; T5's "
                                         r"relative position bias is itself T × T\): use attnlab.capture"):
        capture_long(TEXT, lm)
