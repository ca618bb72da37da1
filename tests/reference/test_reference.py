"""The float64 reference: properties that any attention must have, and its errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnlab.reference.masks import causal_mask
from attnlab.reference.attention import attention, logsumexp, softmax, softmax_jacobian

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)


@st.composite
def qkv(draw, max_t=7, max_d=5):
    tq, tk = draw(st.integers(1, max_t)), draw(st.integers(1, max_t))
    d, dv = draw(st.integers(1, max_d)), draw(st.integers(1, max_d))
    q = draw(hnp.arrays(np.float64, (tq, d), elements=finite))
    k = draw(hnp.arrays(np.float64, (tk, d), elements=finite))
    v = draw(hnp.arrays(np.float64, (tk, dv), elements=finite))
    mask = draw(hnp.arrays(np.bool_, (tq, tk)))
    return q, k, v, mask


# ------------------------------------------------------------------ softmax and friends


def test_softmax_is_stable_for_huge_scores():
    x = np.array([[1e4, 0.0, -1e4], [1e308, 1e308, -1e308], [-1e4, -1e4, -1e4]])
    p = softmax(x)
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p, [[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]])


def test_softmax_of_all_minus_inf_row_is_zero_not_nan():
    p = softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    np.testing.assert_array_equal(p, [[0, 0], [1, 0]])


def test_logsumexp_matches_the_definition_and_survives_large_values():
    x = np.array([1.0, 2.0, 3.0])
    assert logsumexp(x) == pytest.approx(np.log(np.exp(x).sum()))
    assert logsumexp(np.array([1e4, 1e4])) == pytest.approx(1e4 + np.log(2))
    assert logsumexp(np.array([-np.inf, -np.inf])) == -np.inf


def test_softmax_jacobian_matches_finite_differences():
    s = np.array([0.3, -1.2, 2.0, 0.1])
    jac = softmax_jacobian(softmax(s))
    eps = 1e-6
    numeric = np.stack([(softmax(s + eps * e) - softmax(s - eps * e)) / (2 * eps) for e in np.eye(4)], axis=1)
    np.testing.assert_allclose(jac, numeric, atol=1e-8)  # jac[i, j] = ∂α_i/∂s_j


def test_softmax_jacobian_vanishes_as_softmax_saturates():
    norms = [np.linalg.norm(softmax_jacobian(softmax(c * np.array([1.0, 0.0, -1.0])))) for c in (1, 10, 100)]
    assert norms[0] > norms[1] > norms[2] and norms[2] < 1e-20


# ------------------------------------------------------------------ properties (hypothesis)


@settings(max_examples=60, deadline=None)
@given(qkv())
def test_rows_sum_to_one_and_masked_keys_get_exactly_zero(case):
    q, k, v, mask = case
    _, w = attention(q, k, v, mask=mask, return_weights=True)
    assert (w[~mask] == 0).all()
    sums = w.sum(axis=-1)
    has_key = mask.any(axis=-1)
    np.testing.assert_allclose(sums[has_key], 1.0)
    assert (sums[~has_key] == 0).all()


@settings(max_examples=60, deadline=None)
@given(qkv(), st.randoms(use_true_random=False))
def test_permuting_keys_and_values_together_changes_nothing(case, rnd):
    q, k, v, _ = case
    perm = list(range(k.shape[0]))
    rnd.shuffle(perm)
    np.testing.assert_allclose(attention(q, k[perm], v[perm]), attention(q, k, v), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(qkv(), st.randoms(use_true_random=False))
def test_permuting_queries_permutes_the_output(case, rnd):
    q, k, v, _ = case
    perm = list(range(q.shape[0]))
    rnd.shuffle(perm)
    np.testing.assert_allclose(attention(q[perm], k, v), attention(q, k, v)[perm], atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(qkv(), hnp.arrays(np.float64, st.integers(1, 7), elements=finite))
def test_a_constant_added_to_a_row_of_scores_changes_nothing(case, shifts):
    q, k, v, mask = case
    shift = np.resize(shifts, q.shape[0])[:, None]  # one constant per query row, as a bias
    a = attention(q, k, v, mask=mask, return_weights=True)
    b = attention(q, k, v, mask=mask, bias=np.broadcast_to(shift, mask.shape).copy(), return_weights=True)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(qkv())
def test_fully_masked_rows_give_zero_weights_and_zero_output(case):
    q, k, v, mask = case
    mask = mask.copy()
    mask[0] = False
    out, w = attention(q, k, v, mask=mask, return_weights=True)
    assert (w[0] == 0).all() and (out[0] == 0).all()
    assert np.isfinite(out).all()


# ------------------------------------------------------------------ shapes, masks, dtypes


def test_leading_dims_broadcast_and_cross_attention_shapes():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 5, 4))  # (B, H, Tq, D)
    k = rng.standard_normal((1, 3, 7, 4))  # (1, H, Tk, D)
    v = rng.standard_normal((7, 6))  # (Tk, Dv)
    out, w = attention(q, k, v, return_weights=True)
    assert out.shape == (2, 3, 5, 6) and w.shape == (2, 3, 5, 7)


def test_causal_with_fewer_queries_is_aligned_bottom_right():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    _, w = attention(q, k, v, causal=True, return_weights=True)
    # query 0 sits at key position 3, query 1 at 4 (decoding with a cache)
    assert (w[0, 4] == 0) and (w[0, :4] > 0).all() and (w[1] > 0).all()
    np.testing.assert_array_equal(causal_mask(2, 5), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_unscaled_and_default_scale():
    q, k, v = np.array([[1.0, 1.0]]), np.array([[1.0, 0.0], [0.0, 0.0]]), np.eye(2)
    _, w1 = attention(q, k, v, scale=1.0, return_weights=True)
    _, ws = attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(w1[0, 0], np.e / (np.e + 1))
    np.testing.assert_allclose(ws[0, 0], np.exp(2**-0.5) / (np.exp(2**-0.5) + 1))


def test_minus_inf_bias_blocks_a_pair():
    q, k, v = np.ones((1, 2)), np.ones((3, 2)), np.arange(6.0).reshape(3, 2)
    _, w = attention(q, k, v, bias=np.array([[0.0, -np.inf, 0.0]]), return_weights=True)
    np.testing.assert_allclose(w, [[0.5, 0, 0.5]])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_output_keeps_the_input_dtype_and_is_computed_in_float64(dtype):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((4, 8)).astype(dtype) for _ in range(3))
    out, w = attention(q, k, v, return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    exact = attention(*(x.astype(np.float64) for x in (q, k, v)))  # the same values, widened
    np.testing.assert_array_equal(out, exact.astype(dtype))  # float64 inside, rounded once at the end


# ------------------------------------------------------------------ errors name the argument


def _qkv(tq=3, tk=4, d=2, dv=2):
    rng = np.random.default_rng(0)
    return rng.standard_normal((tq, d)), rng.standard_normal((tk, d)), rng.standard_normal((tk, dv))


class _UnhashableDtype:
    """An array-like whose dtype cannot be a dict key (validate.dtype_name remembers the names of those that can)."""

    shape, ndim, dtype = (4, 2), 2, ["float32"]


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda q, k, v: (q, k[:, :1], v), ValueError, r"k must have the same last dim D as q: q has D=2"),
        (lambda q, k, v: (q, _UnhashableDtype(), v), TypeError, r"k must have a floating dtype .* got \['float32'\]"),
        (lambda q, k, v: (q, k, v[:3]), ValueError, r"v must have as many rows as k \(Tk\): k has Tk=4"),
        (lambda q, k, v: (q, k[:0], v[:0]), ValueError, r"at least one key \(Tk >= 1\), got Tk=0"),
        (lambda q, k, v: (q.astype(int), k, v), TypeError, r"q must have a floating dtype .* got int64"),
        (lambda q, k, v: (q, [[1.0, 2.0]], v), TypeError, r"k must be a NumPy array or torch tensor, got list"),
        (lambda q, k, v: (q[0], k, v), ValueError, r"q must have shape \(\.\.\., T, D\) .* got shape \(2,\)"),
        (lambda q, k, v: (np.where(q > 0, np.nan, q), k, v), ValueError, r"q contains NaN or Inf"),
        (lambda q, k, v: (q, k, np.full_like(v, np.inf)), ValueError, r"v contains NaN or Inf"),
        (lambda q, k, v: (q[None].repeat(2, 0), k[None].repeat(3, 0), v), ValueError, r"do not broadcast"),
    ],
)
def test_bad_inputs_are_named(change, error, message):
    with pytest.raises(error, match=message):
        attention(*change(*_qkv()))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"scale": 0.0}, ValueError, r"scale must be a finite number > 0, got 0.0"),
        ({"scale": -1}, ValueError, r"scale must be a finite number > 0, got -1"),
        ({"scale": "big"}, TypeError, r"scale must be a positive float or None"),
        ({"mask": np.ones((3, 5), bool)}, ValueError, r"mask of shape \(3, 5\) does not broadcast to .* \(3, 4\)"),
        ({"mask": np.ones((3, 4))}, TypeError, r"mask must have dtype bool .* got float64; pass additive"),
        ({"bias": np.full((3, 4), np.nan)}, ValueError, r"bias contains NaN or \+Inf"),
        ({"bias": np.ones((2, 4))}, ValueError, r"bias of shape \(2, 4\) does not broadcast"),
    ],
)
def test_bad_options_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        attention(*_qkv(), **kwargs)


# ------------------------------------------------------------------ agreement with PyTorch SDPA


def _sdpa_with_our_conventions(q, k, v, mask, causal):
    """SDPA in float64; causal given to SDPA as an explicit bottom-right mask (SDPA aligns top-left)."""
    import torch
    import torch.nn.functional as F

    allowed = None if mask is None else torch.from_numpy(mask)
    if causal:
        c = torch.from_numpy(causal_mask(q.shape[-2], k.shape[-2]))
        allowed = c if allowed is None else allowed & c
    t = [torch.from_numpy(x) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*t, attn_mask=allowed).numpy()


@pytest.mark.needs("torch")
@pytest.mark.parametrize(
    "tq, tk, d, dv, masked, causal",
    [(97, 97, 59, 59, False, False), (5, 97, 16, 7, True, False), (97, 97, 59, 33, False, True),
     (31, 97, 8, 12, True, True), (1, 1, 3, 2, False, False)],
)
def test_agrees_with_torch_sdpa_in_float64(tq, tk, d, dv, masked, causal):
    rng = np.random.default_rng(tq * 1000 + tk + d)
    q = rng.standard_normal((2, 3, tq, d))
    k, v = rng.standard_normal((2, 3, tk, d)), rng.standard_normal((2, 3, tk, dv))
    mask = rng.random((2, 1, tq, tk)) > 0.3 if masked else None
    if mask is not None:
        mask[..., -1] = True  # SDPA gives NaN on fully masked rows; keep every row alive for the comparison
    ours = attention(q, k, v, mask=mask, causal=causal)
    np.testing.assert_allclose(ours, _sdpa_with_our_conventions(q, k, v, mask, causal), atol=1e-12)
