"""The compiled pooled pass (kernel.pool, the long view's overview) against the same cells in float64 NumPy,
from dense weights exp(s − LSE) with the very LSE it is given: causal, windows, sink tokens, softcap, ALiBi,
grouped heads, odd blocks and tiles, every instruction set; the same bits for any thread count."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from attnlab import masks
from attnlab.backends import kernel
from attnlab.backends.tiling import LOG2E
from attnlab.reference import attention as reference

if kernel.isa() is None:
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)

def _dense_pool(q, k, lse, scale, seen, block, softcap=None, slope=0.0):
    """(sums, maxes) (B, G, N, N) by definition, in float64, from dense [T, T] weights."""
    b, g, t, _ = q.shape
    s = np.einsum("bgid,bjd->bgij", q.astype(np.float64), k.astype(np.float64)) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    s = s - slope * np.abs(np.arange(t)[:, None] - np.arange(t)[None, :])
    w = np.where(seen, np.exp(s - lse.astype(np.float64)[..., None]), 0.0)
    n = -(-t // block)
    full = np.zeros((b, g, n * block, n * block))
    full[..., :t, :t] = w
    cells = full.reshape(b, g, n, block, n, block)
    return cells.sum((3, 5)), cells.max((3, 5))


def _lse(q, k, scale, seen, softcap=None, slope=0.0):
    t = q.shape[2]
    s = np.einsum("bgid,bjd->bgij", q.astype(np.float64), k.astype(np.float64)) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    s = s - slope * np.abs(np.arange(t)[:, None] - np.arange(t)[None, :])
    return reference.logsumexp(np.where(seen, s, -np.inf)).astype(np.float32)


CASES = {
    "full-odd": dict(b=1, g=3, t=97, d=59, mask=None, block=7),
    "causal-gqa": dict(b=2, g=3, t=300, d=32, mask=masks.causal(), block=37),
    "window": dict(b=1, g=2, t=257, d=16, mask=masks.window(37, 5), block=16),
    "sink-tokens-and-window": dict(b=1, g=2, t=300, d=16, mask=(masks.window(20, 0) | masks.sink_tokens(3)) & masks.causal(),
                                   block=10),
    "causal-softcap": dict(b=1, g=2, t=200, d=64, mask=masks.causal(), block=25, softcap=2.0),
    "padding": dict(b=1, g=2, t=150, d=8, mask=masks.causal() & masks.key_lengths(131), block=19),
    "one-cell": dict(b=1, g=1, t=40, d=8, mask=masks.causal(), block=64),
}


@pytest.mark.parametrize("tiles", [None, (16, 23), (1000, 5)], ids=["default", "16x23", "1000x5"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_compiled_pooling_matches_float64_dense_weights(case, tiles, isa):
    rng = np.random.default_rng(zlib.crc32(repr(sorted(case)).encode() + str(case["t"]).encode()))
    b, g, t, d, mask, block = (case[x] for x in ("b", "g", "t", "d", "mask", "block"))
    q = (rng.standard_normal((b, g, t, d)) * 2).astype(np.float32)  # sharp rows: weights near 1 as well
    k = (rng.standard_normal((b, t, d)) * 2).astype(np.float32)
    scale, cap = d**-0.5, case.get("softcap")
    seen = np.ones((t, t), bool) if mask is None else mask.dense(t)[0, 0]
    lse = _lse(q, k, scale, seen, cap)
    sums, maxes = kernel.pool(q, k, lse, scale=scale, block=block, mask=mask, softcap=cap, block_size=tiles)
    want_sums, want_maxes = _dense_pool(q, k, lse, scale, seen, block, cap)
    assert sums.dtype == np.float64 and maxes.dtype == np.float32 and sums.shape == want_sums.shape
    np.testing.assert_allclose(sums, want_sums, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(maxes, want_maxes, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", [CASES[c] for c in ("full-odd", "sink-tokens-and-window", "causal-softcap", "padding")],
                         ids=["full-odd", "sink-tokens-and-window", "causal-softcap", "padding"])
def test_compiled_top_keys_are_each_rows_largest_dense_weights(case, isa):
    """top=K: every row's K largest weights, largest first, ties to the earlier key (a stable sort of the row),
    from the pooled pass's own sweep; the rows that see fewer than K keys end with their first keys of 0."""
    rng = np.random.default_rng(zlib.crc32(repr(sorted(case)).encode()))
    b, g, t, d, mask, block = (case[x] for x in ("b", "g", "t", "d", "mask", "block"))
    q = (rng.standard_normal((b, g, t, d)) * 2).astype(np.float32)
    k = (rng.standard_normal((b, t, d)) * 2).astype(np.float32)
    scale, cap, top = d**-0.5, case.get("softcap"), 6
    seen = np.ones((t, t), bool) if mask is None else mask.dense(t)[0, 0]
    lse = _lse(q, k, scale, seen, cap)
    sums, maxes, keys, weights = kernel.pool(q, k, lse, scale=scale, block=block, mask=mask, softcap=cap, top=top,
                                             block_size=(16, 23))
    assert keys.dtype == np.int64 and weights.dtype == np.float32 and keys.shape == (b, g, t, top)
    plain = kernel.pool(q, k, lse, scale=scale, block=block, mask=mask, softcap=cap, block_size=(16, 23))
    np.testing.assert_array_equal(sums, plain[0])  # the cells are the same with the rows' largest or without
    np.testing.assert_array_equal(maxes, plain[1])
    s = np.einsum("bgid,bjd->bgij", q.astype(np.float64), k.astype(np.float64)) * scale
    s = s if cap is None else cap * np.tanh(s / cap)
    dense = np.where(seen, np.exp(s - lse.astype(np.float64)[..., None]), 0.0)  # (B, G, T, T)
    want = np.argsort(-dense, axis=-1, kind="stable")[..., :top + 1]
    best = np.take_along_axis(dense, want, -1)
    np.testing.assert_allclose(np.take_along_axis(dense, keys, -1), weights, rtol=0, atol=1e-6)  # the weights they have
    np.testing.assert_allclose(weights, best[..., :top], rtol=0, atol=1e-6)  # ... are the largest
    gaps = -np.diff(best, axis=-1)
    # rows with no near-tie (the float32 scores' rounding moves a weight by ~1e-7 of itself)
    clear = ((gaps > 1e-6) | ((best[..., 1:] == 0) & (best[..., :-1] == 0))).all(-1)
    assert clear.mean() > 0.5
    np.testing.assert_array_equal(keys[clear], want[..., :top][clear])
    if mask is not None:  # causal: row 0 sees key 0 only, then the first keys of weight 0
        assert (keys[:, :, 0] == np.arange(top)).all() and (weights[:, :, 0, 1:] == 0).all()


def test_compiled_pooling_takes_alibi_as_the_forward_does():
    rng = np.random.default_rng(3)
    t, d, slope = 120, 16, 0.25
    q = rng.standard_normal((1, 1, t, d)).astype(np.float32)
    k = rng.standard_normal((1, t, d)).astype(np.float32)
    seen = masks.causal().dense(t)[0, 0]
    lse = _lse(q, k, 0.3, seen, slope=slope)
    sums, maxes = np.empty((1, 1, 12, 12)), np.empty((1, 1, 12, 12), np.float32)
    spans = np.zeros((1, 1, t, 4), np.int64)
    spans[0, 0, :, 1] = np.arange(1, t + 1)
    kernel._tiles.pool(q, k, lse, sums, maxes, 0.3, 10, 96, 512, 0, spans=spans, qpos=np.arange(t)[None, None],
                       slopes=np.array([slope * LOG2E], np.float32))
    want_sums, want_maxes = _dense_pool(q, k, lse, 0.3, seen, 10, slope=slope)
    np.testing.assert_allclose(sums, want_sums, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(maxes, want_maxes, rtol=0, atol=1e-6)


def test_compiled_pooling_is_the_same_bits_for_any_thread_count(isa):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 333, 32)).astype(np.float32)
    k = rng.standard_normal((2, 333, 32)).astype(np.float32)
    lse = np.full((2, 3, 333), 6.0, np.float32)
    one = kernel.pool(q, k, lse, scale=0.2, block=17, mask=masks.causal(), threads=1, top=5)
    three = kernel.pool(q, k, lse, scale=0.2, block=17, mask=masks.causal(), threads=3, top=5)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)  # a row of cells is always one thread's, its tiles in order


def _pool_args(**change):
    args = {"q": np.zeros((1, 2, 10, 8), np.float32), "k": np.zeros((1, 10, 8), np.float32),
            "lse": np.zeros((1, 2, 10), np.float32), "sums": np.empty((1, 2, 4, 4)),
            "maxes": np.empty((1, 2, 4, 4), np.float32), "scale": 1.0, "block": 3, "block_q": 4, "block_k": 4, "threads": 1}
    args.update(change)
    return args


@pytest.mark.parametrize("change, text", [
    ({"block": 0}, "block: expected the cells' side in tokens, >= 1, got 0"),
    ({"sums": np.empty((1, 2, 3, 3))}, "sums: expected shape (B=1, G=2, N=4, N=4), got (1, 2, 3, 3)"),
    ({"maxes": np.empty((1, 2, 4, 4))}, "maxes: expected float32 items"),
    ({"lse": np.zeros((1, 2, 9), np.float32)}, "lse: expected shape (B=1, G=2, T=10), got (1, 2, 9)"),
    ({"softcap": -1.0}, "softcap: expected 0 (none) or a finite cap > 0, got -1"),
    ({"top_keys": np.empty((1, 2, 10, 3), np.int64)}, "top_keys, top_weights: expected both"),
    ({"top_keys": np.empty((1, 2, 10, 11), np.int64), "top_weights": np.empty((1, 2, 10, 11), np.float32)},
     "top_keys: expected 1..min(T=10, 1024) largest a row (its last dim), got 11"),
    ({"top_keys": np.empty((1, 2, 10, 3), np.int64), "top_weights": np.empty((1, 2, 10, 4), np.float32)},
     "top_weights: expected shape (B=1, G=2, T=10, X=3), got (1, 2, 10, 4)"),
])
def test_bad_pooling_arguments_raise_naming_them(change, text):
    with pytest.raises(ValueError) as e:
        kernel._tiles.pool(**_pool_args(**change))
    assert text in str(e.value)
