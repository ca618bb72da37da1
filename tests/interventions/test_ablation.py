"""Ablation and head importance on tiny random transformers (a character tokenizer, nothing loaded),
checked against hand computations and finite differences, and once on the default model."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.needs("torch")
try:
    import torch
except ImportError:  # the needs mark skips every test here (on CI: fails them)
    torch = None

from attnlab.interventions.ablation import _spearman, ablate, head_importance, knockout, lm_loss  # noqa: E402
from attnlab.maps.heads import Head  # noqa: E402
from attnlab.transformer import Transformer, TransformerConfig  # noqa: E402

SENTENCES = ["the bank of the river", "money in the bank", "a river bank, steep"]
V = 40


class CharTokenizer:
    """Characters → ids 1..V-1, padded on the right with 0: enough of a tokenizer for ablate."""

    def __call__(self, texts, padding=True, truncation=True, return_tensors="pt", max_length=None):
        rows = [[1 + ord(ch) % (V - 1) for ch in t][:max_length] for t in texts]
        t = max(map(len, rows))
        return {"input_ids": torch.tensor([r + [0] * (t - len(r)) for r in rows]),
                "attention_mask": torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in rows])}


def tiny(causal: bool, seed: int = 0, dtype=torch.float32) -> Transformer:
    kw = dict(norm_eps=1e-12, post_norm=True, embed_norm=True, type_vocab_size=2) if not causal else {}
    c = TransformerConfig(vocab_size=V, d_model=16, num_layers=2, num_heads=4, d_ff=32, max_positions=64,
                          causal=causal, **kw)
    torch.manual_seed(seed)
    net = Transformer(c, backend="torch").to(dtype).eval().requires_grad_(False)
    net.tokenizer = CharTokenizer()
    return net


def _silence(net: Transformer, layer: int, head: int) -> None:
    """Head (layer, head), 0-based, writes nothing: its columns of the output projection are zero."""
    d = net.config.head_dim
    net.blocks[layer].attn.o.weight[:, head * d:(head + 1) * d] = 0.0


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("how", ["zero", "mean"])
def test_a_head_that_writes_nothing_changes_nothing(causal, how):
    net = tiny(causal)
    _silence(net, 1, 2)
    out = ablate(SENTENCES, [(1, 2)], model=net, how=how)
    assert out.heads == ((1, 2),) and isinstance(out.heads[0], Head) and out.metric == ("loss" if causal else "cosine")
    if causal:
        np.testing.assert_allclose(out.ablated_loss, out.loss, atol=1e-6)
    else:
        np.testing.assert_allclose(out.cosine, 1.0, atol=1e-6)
    assert abs(out.effect) < 1e-6
    imp = head_importance(SENTENCES, model=net, how=how, probes=None)
    assert abs(imp.ablation[1, 2]) < 1e-6 and imp.gradient[1, 2] < 1e-6
    assert imp.ablation.shape == imp.gradient.shape == (2, 4)
    assert np.all(np.abs(np.delete(imp.ablation.ravel(), 6)) > 1e-6)  # every other head does something


def test_a_whole_layer_out_is_its_attention_output_bias_by_hand():
    """All heads of layer 2 zeroed: layer 2 is LayerNorm(x + b_o), then its FFN, computed here by hand."""
    import torch.nn.functional as F

    net = tiny(causal=False)
    enc = net.tokenizer(SENTENCES)
    keep = torch.ones(2, 4)
    keep[1] = 0.0
    with torch.no_grad():
        ours = net.run_with_hooks(enc["input_ids"], enc["attention_mask"], fwd_hooks=knockout(net.config, keep))
    first = Transformer(TransformerConfig(**{**net.config.__dict__, "num_layers": 1}), backend="torch").eval()
    first.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("blocks.1.")})
    with torch.no_grad():
        x = first(enc["input_ids"], enc["attention_mask"])  # (B, T, d) after layer 1
    b = net.blocks[1]
    x = F.layer_norm(x + b.attn.o.bias, (16,), b.norm1.weight, b.norm1.bias, 1e-12)
    ffn = F.gelu(x @ b.ffn.up.weight.T + b.ffn.up.bias) @ b.ffn.down.weight.T + b.ffn.down.bias
    by_hand = F.layer_norm(x + ffn, (16,), b.norm2.weight, b.norm2.bias, 1e-12)
    assert float((ours - by_hand).abs().max()) < 1e-5


def test_mean_ablation_fills_the_heads_mean():
    """With a head replaced by its mean, ablating it again changes nothing more: its output is that mean."""
    net = tiny(causal=True)
    enc = net.tokenizer(SENTENCES)
    _, cache = net.run_with_cache(enc["input_ids"], enc["attention_mask"], names=["blocks.0.attn.hook_z"])
    heads = [cache["blocks.0.attn.hook_z"]]  # layer 1's heads (B, H, T, Dh)
    real = enc["attention_mask"].bool()
    want = heads[0][:, 1].permute(0, 1, 2)[real].mean(0)  # layer 1, head 2: mean over real tokens (Dh,)
    from attnlab.interventions.ablation import head_means

    got = head_means(net, enc["input_ids"], enc["attention_mask"])
    assert got.shape == (2, 4, 4)
    assert float((got[0, 1] - want).abs().max()) < 1e-6


def _by_heads(f, eps=1e-6):
    """∂f/∂ξ_h by central differences for every head of the tiny model (2 layers × 4 heads): [layer][head],
    ξ the head's gate (``keep`` of :func:`knockout`), 1 for every head but the one moved by ±eps."""
    out = []
    for layer in range(2):
        row = []
        for head in range(4):
            up, down = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
            up[layer, head], down[layer, head] = 1 + eps, 1 - eps
            row.append((f(up) - f(down)) / (2 * eps))
        out.append(row)
    return out


def test_lm_gradient_importance_is_michels_derivative_by_finite_differences():
    net = tiny(causal=True, dtype=torch.float64)
    imp = head_importance(SENTENCES, model=net)
    enc = net.tokenizer(SENTENCES)
    d = _by_heads(lambda keep: lm_loss(net, enc["input_ids"], enc["attention_mask"],
                                       fwd_hooks=knockout(net.config, keep)))  # (B,) each
    fd = np.array([[float(x.abs().mean()) for x in row] for row in d])  # E_x |∂L(x)/∂ξ_h|
    np.testing.assert_allclose(imp.gradient, fd, rtol=1e-5, atol=1e-9)


def test_encoder_gradient_is_the_jacobian_norm_by_finite_differences():
    from attnlab.interventions.ablation import _embed

    net = tiny(causal=False, dtype=torch.float64)
    imp = head_importance(SENTENCES, model=net, probes=None)
    enc = net.tokenizer(SENTENCES)
    d = _by_heads(lambda keep: _embed(net, enc["input_ids"], enc["attention_mask"],
                                      fwd_hooks=knockout(net.config, keep)))  # (B, d) each
    fd = np.array([[float(x.norm(dim=-1).mean()) for x in row] for row in d])
    np.testing.assert_allclose(imp.gradient, fd, rtol=1e-5)


def test_importance_is_deterministic_for_a_seed_and_exact_with_every_probe():
    net = tiny(causal=False)
    a = head_importance(SENTENCES, model=net, probes=5, seed=3)
    b = head_importance(SENTENCES, model=net, probes=5, seed=3)
    other = head_importance(SENTENCES, model=net, probes=5, seed=4)
    np.testing.assert_array_equal(a.gradient, b.gradient)
    np.testing.assert_array_equal(a.ablation, b.ablation)
    assert not np.array_equal(a.gradient, other.gradient)
    exact = head_importance(SENTENCES, model=net, probes=None)
    full = head_importance(SENTENCES, model=net, probes=16, seed=7)  # 16 = d: a whole orthonormal basis
    np.testing.assert_allclose(full.gradient, exact.gradient, rtol=1e-4)
    assert a.top(1)[0].head == tuple(int(i) for i in np.unravel_index(a.ablation.argmax(), (2, 4)))


def test_spearman_against_a_hand_ranking():
    assert _spearman(np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0, 40.0])) == pytest.approx(1.0)
    assert _spearman(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    # ties take their average rank: ranks (1.5, 1.5, 3) and (1, 2, 3) → rho = 0.866...
    assert _spearman(np.array([5.0, 5.0, 9.0]), np.array([1.0, 2.0, 3.0])) == pytest.approx(np.sqrt(3) / 2)


@pytest.mark.parametrize("heads, how, error, match", [
    ([(-1, 0)], "zero", ValueError, r"heads\[0\] must be a 0-based"), ([(2, 0)], "zero", ValueError, "layer 0..1"),
    ([(0, 4)], "zero", ValueError, "head 0..3"), ([(0, 0)], "half", ValueError, "how must be one of"),
    (["1.1"], "zero", TypeError, "pair"),
])
def test_bad_arguments_name_what_was_expected(heads, how, error, match):
    with pytest.raises(error, match=match):
        ablate(SENTENCES, heads, model=tiny(causal=True), how=how)


@pytest.mark.model
def test_default_model_ablation_lowers_the_cosine():
    bank = ["I sat on the bank of the river.", "I put the money in the bank."]
    one = ablate(bank, [(0, 0)])
    every = ablate(bank, [Head(layer, head) for layer in range(6) for head in range(12)])
    assert one.metric == "cosine" and one.cosine.shape == (2,)
    assert np.all(one.cosine <= 1.0 + 1e-6) and np.all(one.cosine > 0.9)
    assert np.all(every.cosine < one.cosine)  # all 72 heads out moves the embedding much further
    assert one.to_dict()["heads"] == [{"layer": 0, "head": 0}]
