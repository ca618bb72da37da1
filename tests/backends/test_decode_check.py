"""A plain ``attention`` call's NaN/Inf check of q, k and v folded into the compiled decode pass (no second read).

prepare(defer_kv=True) leaves q, k and v to the backend that reads them where it says it checks them
(Backend.checks_kv: the kernel's decode pass); the pass notes a NaN or Inf in q and a score that is not
finite (a NaN or Inf in a key), the call checks its output (a value), and the call then raises the error
that names q, k or v, as a check before the pass did. Any other backend gets them checked first.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab.backends import kernel
from attnlab.backends.dispatch import NoBackendError
from attnlab.backends.request import DEFER_MAX_TQ, Unchecked
from attnlab.reference import attention as reference
from attnlab.reference import validate

if kernel.isa() is None:
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)

N = 100_003  # keys: not a multiple of any block or chunk


@pytest.fixture(scope="module")
def cache():
    rng = np.random.default_rng(32)
    q = rng.standard_normal((1, 4, 1, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, N, 16)).astype(np.float32) for _ in "kv")
    return q, k, v


@pytest.mark.parametrize("name", ["k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_entry_anywhere_in_a_long_cache_is_refused_naming_it(cache, name, bad):
    """Start, middle and end of a 100,003-key cache, at a random head and channel: each refused, by auto and by
    the kernel, with the error a check before the pass gives."""
    q, k, v = cache
    rng = np.random.default_rng(int(np.isnan(bad)) + 2 * int(bad > 0 if not np.isnan(bad) else 0) + 4 * (name == "v"))
    x = k if name == "k" else v
    for where in (int(rng.integers(0, 64)), int(rng.integers(N // 2 - 500, N // 2 + 500)), int(rng.integers(N - 64, N))):
        at = (0, int(rng.integers(2)), where, int(rng.integers(16)))
        keep, x[at] = x[at], bad
        try:
            for backend in ("auto", "kernel"):
                with pytest.raises(ValueError, match=f"^{name} contains NaN or Inf; attention needs finite inputs"):
                    attnlab.attention(q, k, v, causal=True, backend=backend)
        finally:
            x[at] = keep


def test_the_decode_call_reads_k_and_v_once_and_others_check_them_first(cache, monkeypatch):
    """Served by the decode pass, q, k and v are not scanned before it; the tiles path and a call beyond
    DEFER_MAX_TQ rows check all three first, as before."""
    q, k, v = cache
    scanned = []
    check = validate.check_finite
    monkeypatch.setattr(validate, "check_finite", lambda name, x: scanned.append(name) or check(name, x))
    want = attnlab.attention(q, k, v, causal=True, backend="kernel", block_size=kernel.BLOCK)
    assert scanned == ["q", "k", "v"]
    scanned.clear()
    got = attnlab.attention(q, k, v, causal=True, backend="kernel")
    assert scanned == []
    np.testing.assert_allclose(got, want, atol=2e-6)
    scanned.clear()
    rows = np.repeat(q, DEFER_MAX_TQ + 1, axis=2)
    attnlab.attention(rows, k[:, :, :100], v[:, :, :100], causal=True, backend="kernel")
    assert scanned == ["q", "k", "v"]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_query_is_refused_naming_it_even_where_its_row_sees_no_key(cache, bad):
    """q's NaN or Inf, in a row that scores keys and in a sequence of length 0 (no score computed): the error
    that names q, by auto and by the kernel; kernel.decode(check=True) raises Unchecked for the caller to check."""
    q, k, v = (x[:, :, :300].copy() if x.shape[2] > 1 else x.copy() for x in cache)
    for head in (0, 3):
        q[0, head, 0, 5] = bad
        for lengths in (None, np.array([0])):
            for backend in ("auto", "kernel"):
                with pytest.raises(ValueError, match="^q contains NaN or Inf; attention needs finite inputs"):
                    attnlab.attention(q, k, v, causal=True, lengths=lengths, backend=backend)
            with pytest.raises(Unchecked):
                kernel.decode(q, k, v, lengths, scale=0.25, causal=True, check=True)
        q[0, head, 0, 5] = 0.0


def test_the_kernel_checks_what_it_reads_and_leaves_keys_no_row_sees(cache):
    """kernel.decode(check=True) raises Unchecked on a NaN key or value it reads; keys beyond lengths are not read."""
    q, k, v = (x[:, :, :2000].copy() for x in cache)
    lengths = np.array([1000])
    k[0, 1, 1500, 3] = np.nan  # beyond the sequence's length: not read, not checked
    out, _ = kernel.decode(q, k, v, lengths, scale=0.25, causal=True, check=True)
    assert np.isfinite(out).all()
    for x in (k, v):
        x[0, 0, 999, 0] = np.inf
        with pytest.raises(Unchecked):
            kernel.decode(q, k, v, lengths, scale=0.25, causal=True, check=True)
        x[0, 0, 999, 0] = 0.0
        assert np.isnan(kernel.decode(q, k, v, lengths, scale=0.25, causal=True)[0]).sum() == 0  # finite again


def test_scores_beyond_float32s_range_fall_back_to_the_checked_call(cache):
    """Finite keys whose scores the pass finds beyond its range (base.OVERFLOW_LIMIT): the call is checked and
    chosen as before it (the kernel refuses by the score bound). Where the scores it computed stay in range,
    though the bound from max|q|, max|k| does not, the pass's result stands (docs/design.md)."""
    q, k, v = (x[:, :, :50].copy() for x in cache)
    with pytest.raises(NoBackendError, match="backend 'kernel' cannot serve this call: scores reach up to"):
        attnlab.attention(q * np.float32(10), k * np.float32(3e37), v, causal=True, backend="kernel")
    big = k * np.float32(2e37)  # largest |score| 0.67 of the limit, the bound 1.57
    wide = [np.repeat(x.astype(np.float64), 2, axis=1) for x in (big, v)]  # k/v head h // 2 of query head h
    want = reference.attention(q.astype(np.float64), *wide, causal=True)
    with pytest.raises(NoBackendError, match="scores reach up to"):
        attnlab.attention(q, big, v, causal=True, backend="kernel", block_size=kernel.BLOCK)  # checked first
    np.testing.assert_allclose(attnlab.attention(q, big, v, causal=True, backend="kernel"), want, atol=1e-5)
