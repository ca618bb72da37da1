"""Long-input statistics equal the same statistics computed from dense maps (an encoder and a
causal decoder), computed here by hand from capture's [L, H, T, T] weights."""

import numpy as np
import pytest

import attnlab
from attnlab.interventions.stats import ROW_STATS, head_stats

pytestmark = pytest.mark.needs("torch", "transformers")

WORDS = "the river runs past the bank and the money sits in the bank while I sat on the bank of the river".split()


def _dense(w, causal, window=None):
    """The statistics of ROW_STATS and the column sums from one text's dense weights [L, H, T, T]."""
    w = w.astype(np.float64)
    t = w.shape[-1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    seen = np.ones((t, t), bool) if not causal else j <= i
    if window is not None:
        seen &= j >= i - window
    n = seen.sum(-1)
    ent = -(w * np.log(np.where(w > 0, w, 1))).sum(-1)  # (L, H, T)
    return {
        "prev": np.diagonal(w, -1, -2, -1).mean(-1), "self": np.diagonal(w, 0, -2, -1).mean(-1),
        "next": np.diagonal(w, 1, -2, -1).mean(-1), "first": w[..., 0].mean(-1),
        "distance": (w * np.abs(i - j)).sum(-1).mean(-1), "entropy": ent.mean(-1),
        "entropy_norm": (ent[..., n > 1] / np.log(n[n > 1])).mean(-1),
    }, w.sum(-2)


def _text(n_words, seed=0):
    return " ".join(np.random.default_rng(seed).choice(WORDS, n_words))


def _check(maps, stats, causal, window=None):
    want, received = _dense(maps.weights[0], causal, window)
    for name in ROW_STATS:
        np.testing.assert_allclose(stats.means[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(stats.received[0], received, rtol=1e-5, atol=1e-5)


def test_encoder_at_512_tokens_equals_dense_maps(default_model):
    text = _text(510)  # every word one WordPiece: 510 + [CLS] + [SEP]
    stats = head_stats(text, default_model, block_rows=100)  # blocks that do not divide T
    assert stats.received[0].shape == (6, 12, 512) and not stats.causal
    maps = attnlab.capture([text], default_model)
    assert maps.tokens[0] == stats.tokens[0]
    _check(maps, stats, causal=False)


@pytest.fixture(scope="module")
def llama_512(tmp_path_factory):
    import torch
    import transformers as tf


    import tiny_models as tiny
    folder = tmp_path_factory.mktemp("llama-512")
    tok = tiny._fast(tiny.sentencepiece(["<unk>", "<s>", "</s>", "<pad>"], "<s> $A"), bos_token="<s>", eos_token="</s>",
                     unk_token="<unk>", pad_token="<pad>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
    net = tf.LlamaModel(config)
    with torch.no_grad():  # larger query/key weights: sharper maps than random init gives, so the test has teeth
        for layer in net.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    net.save_pretrained(folder)
    return folder


def test_causal_decoder_at_512_tokens_equals_dense_maps(llama_512):
    from attnlab.hf.loading import load_model

    lm = load_model(llama_512)
    ids = lm.tokenizer(_text(400))["input_ids"][:512]
    assert len(ids) == 512
    text = lm.tokenizer.decode(ids[1:], skip_special_tokens=True)
    stats = head_stats(text, lm, max_tokens=512, block_rows=96)
    maps = attnlab.capture([text], lm)
    assert maps.tokens[0] == stats.tokens[0] and stats.causal
    assert stats.means["entropy_norm"].max() < 0.99  # not uniform: the statistics are tested on real structure
    _check(maps, stats, causal=True)
    top = stats.top_received(0, 3)
    assert top[0][0] == int(np.argmax(stats.received[0].mean((0, 1)))) and len(top) == 3


def test_sliding_window_decoder_equals_dense_maps(tmp_path):

    import tiny_models as tiny
    tiny.build("mistral", tmp_path)
    text = "The river runs past the bank, slowly! I put the money in the bank."
    stats = head_stats(text, tmp_path, block_rows=5)
    maps = attnlab.capture([text], tmp_path)
    _check(maps, stats, causal=True, window=tiny.WINDOW - 1)


def test_softcapped_decoder_equals_dense_maps(tmp_path):
    """Gemma-2's softcapped scores (and window): the kernel caps them in its tiles, in the forward and the pass."""
    import tiny_models as tiny
    tiny.build("gemma2", tmp_path)
    text = "The river runs past the bank, slowly! I put the money in the bank."
    stats = head_stats(text, tmp_path, block_rows=5)
    w = attnlab.capture([text], tmp_path).weights[0]
    for layer, window in enumerate((tiny.WINDOW - 1, None)):  # Gemma-2 alternates sliding and full layers
        want, received = _dense(w[layer:layer + 1], True, window)
        for name in ROW_STATS:
            np.testing.assert_allclose(stats.means[name][layer], want[name][0], rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(stats.received[0][layer], received[0], rtol=1e-5, atol=1e-5)


def test_bad_texts(default_model):
    with pytest.raises(ValueError, match="texts must be"):
        head_stats([], default_model)
    with pytest.raises(ValueError, match="takes at most 512"):
        head_stats(_text(700), default_model)


@pytest.mark.parametrize("h, hkv, t, d, causal, window, softcap", [
    (8, 4, 300, 32, True, None, None), (4, 4, 200, 64, False, None, None), (6, 2, 257, 32, False, (20, 7), None),
    (2, 1, 129, 16, True, (50, 0), None), (4, 2, 180, 32, True, None, 2.0),
])
@pytest.mark.needs("kernel")
def test_the_pytorch_pass_and_the_compiled_pass_agree(h, hkv, t, d, causal, window, softcap):
    """Builds without a C compiler use the PyTorch pass (layer_stats): it gives what the compiled one does
    (which test_tiles.py checks against float64 dense weights), with grouped-query heads and bands."""
    import torch

    from attnlab.interventions.stats import compiled_layer_stats, layer_stats

    gen = torch.Generator().manual_seed(t)
    q, k = torch.randn(h, t, d, generator=gen) * 1.5, torch.randn(hkv, t, d, generator=gen) * 1.5
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    left = None if window is None else window[0]
    right = 0 if causal else (None if window is None else window[1])
    seen = torch.ones(t, t, dtype=torch.bool)
    if left is not None:
        seen &= j >= i - left
    if right is not None:
        seen &= j <= i + right
    s = (q @ k.repeat_interleave(h // hkv, 0).transpose(-1, -2)).double() * d**-0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    lse = torch.logsumexp(s.masked_fill(~seen, -torch.inf), -1).float()
    a, counts_a, received_a = layer_stats(q, k, lse, scale=d**-0.5, causal=causal, window=window, softcap=softcap,
                                          block_rows=37)
    b, counts_b, received_b = compiled_layer_stats(q, k, lse, scale=d**-0.5, causal=causal, window=window,
                                                   softcap=softcap)
    assert counts_a == counts_b
    for name in ROW_STATS:
        np.testing.assert_allclose(a[name], b[name], rtol=2e-6, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(received_a, received_b, rtol=2e-6, atol=1e-5)
