import numpy as np
import pytest

from attnlab.reference.additive import AdditiveAttention
from attnlab.reference.multihead import MultiHeadAttention
from attnlab.reference.attention import softmax


def _by_hand(layer, x, ctx, scale):
    """Head by head with explicit loops: an independent reading of Vaswani et al. §3.2.2."""
    heads = []
    for h in range(layer.num_heads):
        cols = slice(h * layer.d_head, (h + 1) * layer.d_head)
        vcols = slice(h * layer.d_v, (h + 1) * layer.d_v)
        q = x @ layer.w_q[:, cols] + layer.b_q[cols]
        k = ctx @ layer.w_k[:, cols] + layer.b_k[cols]
        v = ctx @ layer.w_v[:, vcols] + layer.b_v[vcols]
        heads.append(softmax(q @ k.T * scale) @ v)
    return np.concatenate(heads, axis=-1) @ layer.w_o + layer.b_o


def test_self_attention_matches_a_head_by_head_computation():
    layer = MultiHeadAttention(d_model=12, num_heads=3, seed=1)
    x = np.random.default_rng(0).standard_normal((5, 12))
    res = layer(x)
    assert res.output.shape == (5, 12) and res.weights.shape == (3, 5, 5) and res.heads.shape == (3, 5, 4)
    np.testing.assert_allclose(res.output, _by_hand(layer, x, x, 1 / 2), atol=1e-12)
    np.testing.assert_allclose(res.weights.sum(-1), 1.0)


def test_cross_attention_with_different_sizes_and_lengths():
    layer = MultiHeadAttention(d_model=8, num_heads=2, d_kv=6, d_v=5, seed=2)
    rng = np.random.default_rng(1)
    x, ctx = rng.standard_normal((3, 8)), rng.standard_normal((7, 6))
    res = layer(x, ctx)
    assert res.output.shape == (3, 8) and res.weights.shape == (2, 3, 7) and res.heads.shape == (2, 3, 5)
    np.testing.assert_allclose(res.output, _by_hand(layer, x, ctx, 1 / 2), atol=1e-12)


def test_batched_and_causal():
    layer = MultiHeadAttention(d_model=8, num_heads=4, seed=3)
    x = np.random.default_rng(2).standard_normal((2, 6, 8))
    res = layer(x, causal=True)
    assert res.weights.shape == (2, 4, 6, 6)
    assert np.allclose(np.triu(res.weights, 1), 0)
    np.testing.assert_allclose(layer(x[1], causal=True).output, res.output[1])


def test_seeded_initialisation_is_reproducible():
    a, b, c = (MultiHeadAttention(8, 2, seed=s) for s in (7, 7, 8))
    assert np.array_equal(a.w_q, b.w_q) and not np.array_equal(a.w_q, c.w_q)


def test_from_weights_checks_shapes_and_loads_a_layer():
    rng = np.random.default_rng(0)
    w_q, w_k, w_v, w_o = (rng.standard_normal(s) for s in [(4, 6), (4, 6), (4, 6), (6, 4)])
    layer = MultiHeadAttention.from_weights(w_q, w_k, w_v, w_o, num_heads=2, b_o=np.ones(4))
    assert (layer.d_head, layer.d_v, layer.num_heads) == (3, 3, 2)
    with pytest.raises(ValueError, match=r"w_k must have shape \(\?, 6\), got \(4, 5\)"):
        MultiHeadAttention.from_weights(w_q, w_k[:, :5], w_v, w_o, num_heads=2)
    with pytest.raises(ValueError, match=r"w_q has 6 columns, not divisible by num_heads=4"):
        MultiHeadAttention.from_weights(w_q, w_k, w_v, w_o, num_heads=4)
    with pytest.raises(ValueError, match=r"b_o must have shape \(4,\), got \(3,\)"):
        MultiHeadAttention.from_weights(w_q, w_k, w_v, w_o, num_heads=2, b_o=np.ones(3))


def test_multihead_input_errors():
    layer = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, 8\), got \(3, 7\)"):
        layer(np.ones((3, 7)))
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match=r"num_heads must be an int >= 1, got 0"):
        MultiHeadAttention(8, 0)


# ------------------------------------------------------------------ additive (Bahdanau)


def test_additive_scores_follow_the_formula():
    att = AdditiveAttention(d_query=3, d_key=4, d_hidden=5, seed=0)
    rng = np.random.default_rng(0)
    s, h = rng.standard_normal((2, 3)), rng.standard_normal((6, 4))
    context, alpha = att(s, h)
    e = np.array([[att.v @ np.tanh(si @ att.w + hj @ att.u) for hj in h] for si in s])
    np.testing.assert_allclose(alpha, softmax(e), atol=1e-12)
    np.testing.assert_allclose(context, alpha @ h, atol=1e-12)
    assert context.shape == (2, 4) and alpha.shape == (2, 6)


def test_additive_mask_and_errors():
    att = AdditiveAttention.from_weights(np.eye(2), np.eye(2), np.ones(2))
    h = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    _, alpha = att(np.ones((1, 2)), h, mask=np.array([[True, False, True]]))
    assert alpha[0, 1] == 0 and alpha.sum() == pytest.approx(1)
    with pytest.raises(ValueError, match=r"h must have shape \(\.\.\., T, 2\), got \(3, 5\)"):
        att(np.ones((1, 2)), np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"must agree on d_hidden"):
        AdditiveAttention.from_weights(np.eye(2), np.eye(3), np.ones(2))
    with pytest.raises(ValueError, match=r"s contains NaN or Inf"):
        att(np.full((1, 2), np.nan), h)
