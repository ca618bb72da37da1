"""attnlab.masks: each kind's rule written out by hand, the intervals it is stored as, and the bad input
each refuses (naming the argument, what it got and what was expected)."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import masks
from attnlab.backends.api import attention
from attnlab.backends.dispatch import NoBackendError
from attnlab.masks import intervals


def _pos(tq, tk, ends=None):
    """(B|1, Tq, 1): query i at end − Tq + i (end Tk, or each sequence's)."""
    end = np.array([tk]) if ends is None else np.asarray(ends)
    return end[:, None, None] - tq + np.arange(tq)[None, :, None]


J = lambda tk: np.arange(tk)[None, None, :]  # noqa: E731


@pytest.mark.parametrize("tq, tk", [(7, 7), (3, 9), (9, 4)])
def test_each_kind_is_its_rule_bottom_right(tq, tk):
    pos, j = _pos(tq, tk), J(tk)
    ids = np.repeat(np.arange(3), [1, tk - 3, 2])  # documents of 1, Tk − 3 and 2 keys
    doc_of_pos = np.where((pos >= 0) & (pos < tk), ids[np.clip(pos, 0, tk - 1)], -1)
    by_hand = {
        "causal": (masks.causal(), j <= pos),
        "window(2, 1)": (masks.window(2, 1), (j >= pos - 2) & (j <= pos + 1)),
        "window(None, 0)": (masks.window(None, 0), j <= pos),
        "documents": (masks.documents(ids), ids[None, None, :] == doc_of_pos),
        "prefix": (masks.prefix(2), np.broadcast_to(j < 2, (1, tq, tk))),
        "key_lengths": (masks.key_lengths([3]), np.broadcast_to(j < 3, (1, tq, tk))),
        "sink_tokens": (masks.sink_tokens(1), np.broadcast_to(j < 1, (1, tq, tk))),
        "(window | sinks) & causal": ((masks.window(1) | masks.sink_tokens(2)) & masks.causal(),
                                      ((j >= pos - 1) | (j < 2)) & (j <= pos)),
        "prefix | causal": (masks.prefix(3) | masks.causal(), (j < 3) | (j <= pos)),
    }
    for name, (m, want) in by_hand.items():
        got = m.dense(tq, tk)
        np.testing.assert_array_equal(got[0, 0], np.broadcast_to(want, (1, tq, tk))[0], err_msg=name)
        b, h, i, jj = np.zeros((1, 1, 1, 1), int), np.zeros((1, 1, 1, 1), int), np.arange(tq)[:, None], np.arange(tk)[None]
        np.testing.assert_array_equal(m.mask_mod(tq, tk)(b, h, i, jj).reshape(tq, tk), got[0, 0], err_msg=name)


def test_cache_lengths_place_each_sequences_queries_at_its_own_length():
    m = masks.causal() & masks.window(2) & masks.cache_lengths([6, 3])
    got = m.dense(2, 6, (2, 1))[:, 0]  # (B, Tq, Tk)
    pos, j = _pos(2, 6, [6, 3]), J(6)
    np.testing.assert_array_equal(got, (j <= pos) & (j >= pos - 2) & (j < np.array([6, 3])[:, None, None]))


def test_rows_are_stored_as_at_most_two_sorted_intervals():
    m = (masks.window(2) | masks.sink_tokens(3)) & masks.causal()
    f = m.frame(10)
    lo, hi = m.spans(f)
    assert lo.shape == (1, 1, 10, 2)
    np.testing.assert_array_equal(intervals.contains(lo, hi, np.arange(10))[0, 0], m.dense(10)[0, 0])
    assert (lo[0, 0, 9] == [0, 7]).all() and (hi[0, 0, 9] == [3, 10]).all()  # keys 0..2 and 7..9
    assert (lo[0, 0, 3] == [0, 0]).all() and (hi[0, 0, 3] == [4, 0]).all()  # one run: the second is empty


def test_a_row_needing_three_runs_is_not_structured_and_served_by_its_rule():
    lo = np.array([[0, 4, 8]])
    with pytest.raises(intervals.NotStructured, match="3 separate runs"):
        intervals.normalise(lo, lo + 2)
    lo, hi = intervals.normalise(np.array([[4, 0, 1, 9]]), np.array([[6, 2, 5, 9]]))  # [0, 6) once merged
    assert (lo == [[0]]).all() and (hi == [[6]]).all()


def test_callables_and_objects_combine():
    stripes = masks.mask_mod(lambda b, h, q, kv: (kv % 2) == 0)
    m = stripes & masks.causal()
    assert not m.structured
    got = m.dense(5)[0, 0]
    want = (np.arange(5)[None] % 2 == 0) & (np.arange(5)[None] <= np.arange(5)[:, None])
    np.testing.assert_array_equal(got, want)


def test_alibi_slopes_are_the_papers():
    assert masks.alibi_slopes(8) == [2 ** -(i + 1) for i in range(8)]
    assert len(masks.alibi_slopes(12)) == 12 and masks.alibi_slopes(12)[:8] == masks.alibi_slopes(8)


def test_alibi_is_minus_slope_times_distance_bottom_right():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 1, 2, 4, 8))
    k, v = rng.standard_normal((2, 1, 2, 6, 8))
    slopes = np.array([0.5, 0.25])
    dist = np.abs(np.arange(6)[None, :] - (np.arange(4)[:, None] + 2))  # (Tq, Tk): query i at 6 − 4 + i
    bias = -slopes[:, None, None] * dist  # (H, Tq, Tk)
    np.testing.assert_allclose(attention(q, k, v, score_mod=masks.alibi(slopes), backend="numpy"),
                               attention(q, k, v, bias=bias[None], backend="numpy"), atol=1e-14)


def test_learned_sinks_take_weight_and_give_no_value():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 1, 2, 5, 4))
    sinks = np.array([0.0, 3.0])
    out, w = attention(q, k, v, sink_logits=sinks, return_weights=True, backend="numpy")
    s = q @ np.swapaxes(k, -1, -2) / 2
    e = np.exp(s)
    want = e / (e.sum(-1, keepdims=True) + np.exp(sinks)[None, :, None, None])
    np.testing.assert_allclose(w, want, atol=1e-14)
    assert (w.sum(-1) < 1).all()  # the sink share is 1 − the row's sum
    # a row that sees nothing: zeros (the sink has no value), never NaN, on every backend that serves it
    for backend in ("numpy", "torch", "blockwise", "kernel"):
        x = [a.astype(np.float32) for a in (q, k, v)] if backend == "kernel" else (q, k, v)
        got = attention(*x, sink_logits=sinks, mask=masks.key_lengths([0]), backend=backend)
        assert (got == 0).all(), backend


@pytest.mark.parametrize("make, error, text", [
    (lambda: masks.documents([0, 1, 0]), ValueError, "documents ids must be non-decreasing along each row"),
    (lambda: masks.documents([0.5, 1.0]), TypeError, "documents ids must be integers"),
    (lambda: masks.prefix([-1]), ValueError, "prefix must be >= 0, got -1"),
    (lambda: masks.key_lengths([1.5]), TypeError, "key_lengths must be integers"),
    (lambda: masks.sink_tokens(-2), ValueError, "sink_tokens n must be an int >= 0, got -2"),
    (lambda: masks.window(-1), ValueError, r"left must be an int >= 0 or None \(unbounded\), got -1"),
    (lambda: masks.alibi([[1.0]]), TypeError, "alibi slopes must be a 1-D array"),
    (lambda: masks.mask_mod(3), TypeError, "mask_mod must be callable"),
    (lambda: masks.causal() & 3, TypeError, "mask must be a boolean array, a mask_mod callable"),
])
def test_bad_descriptions_are_refused_when_made(make, error, text):
    with pytest.raises(error, match=text):
        make()


X = np.zeros((2, 3, 6, 4), np.float32)


@pytest.mark.parametrize("kw, error, text", [
    ({"mask": masks.documents([0, 0, 1])}, ValueError, r"documents ids must give one id per key \(Tk = 6\), got 3"),
    ({"mask": masks.documents(np.zeros((3, 6), int))}, ValueError, r"documents ids must be shaped like a prefix of the leading batch dims"),
    ({"mask": masks.prefix([1, 2, 3])}, ValueError, "prefix must be shaped like a prefix of the leading batch dims"),
    ({"mask": masks.key_lengths([7, 1])}, ValueError, r"key_lengths must lie in 0..Tk=6, got up to 7"),
    ({"score_mod": masks.alibi([1.0, 2.0])}, ValueError, r"alibi slopes must have one slope per query head \(3\), got 2"),
    ({"score_mod": lambda s, b, h, i, j: s[..., :1]}, ValueError, "score_mod must return scores of the shape it was given"),
    ({"score_mod": 5}, TypeError, "score_mod must be a callable"),
    ({"sink_logits": np.zeros(4, np.float32)}, ValueError, r"sink_logits must have one logit per query head, shape \(3,\)"),
    ({"sink_logits": np.zeros(3, np.int64)}, TypeError, "sink_logits must be a float array"),
    ({"sink_logits": np.array([0, np.nan, 0], np.float32)}, ValueError, "sink_logits must be finite"),
    ({"mask": np.ones((6, 5), bool)}, ValueError, r"mask of shape \(6, 5\) does not broadcast"),
])
def test_bad_calls_are_refused_before_any_work(kw, error, text):
    for backend in ("numpy", "blockwise"):
        with pytest.raises(error, match=text):
            attention(X, X, X, backend=backend, **kw)


def test_the_kernel_refuses_callables_by_name_and_auto_routes_them_to_blockwise():
    mod = masks.mask_mod(lambda b, h, q, kv: kv <= q)
    with pytest.raises(NoBackendError, match=r"kernel.*a mask evaluated by its rule .*instead: blockwise"):
        attention(X, X, X, mask=mod, backend="kernel")
    with pytest.raises(NoBackendError, match=r"kernel.*a score_mod callable \(instead: blockwise\)"):
        attention(X, X, X, score_mod=lambda s, b, h, i, j: s, backend="kernel")
    np.testing.assert_allclose(attention(X, X, X, mask=mod), attention(X, X, X, causal=True), atol=1e-7)


def test_a_score_mod_that_makes_nan_is_an_error_not_a_nan_output():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 4, 4))
    for backend in ("numpy", "torch", "blockwise"):
        with pytest.raises(ValueError, match="score_mod returned NaN"):
            attention(q, q, q, score_mod=lambda s, b, h, i, j: s * np.nan if not hasattr(s, "nan_to_num") else s * float("nan"),
                      backend=backend)


@pytest.mark.needs("torch")
def test_sink_gradients_are_as_accurate_as_plain_torch_float32():
    """∂L/∂sink from the forward's LSE (kernel, blockwise) against float64 autograd: at most 2x the error of
    plain torch float32 autograd, with GQA, causal and a row that sees no key (its sink still takes weight)."""
    import torch

    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(2, 4, 40, 16, generator=g), torch.randn(2, 2, 50, 16, generator=g), torch.randn(2, 2, 50, 8, generator=g)
    sinks, dout = torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.randn(2, 4, 40, 8, generator=g)
    kw = {"causal": True, "mask": masks.key_lengths([50, 12])}

    def grad(backend, dtype):
        s = sinks.to(dtype).clone().requires_grad_()
        out = attention(*(x.to(dtype) for x in (q, k, v)), sink_logits=s, backend=backend, **kw)
        (out * dout.to(dtype)).sum().backward()
        return s.grad.double()

    exact = grad("torch", torch.float64)
    plain = (grad("torch", torch.float32) - exact).norm()
    for backend in ("kernel", "blockwise"):
        assert (grad(backend, torch.float32) - exact).norm() <= 2 * plain + 1e-7, backend
