"""The compiled forward pass (``_tiles.c``) against the float64 reference and the Python loop.

It serves float32 CPU calls; the float64 cases of test_backends.py run the Python loop, so the
compiled kernel gets its own cases here: odd sizes, head dims that are not whole vectors, tiles
that divide nothing, bands, padding, GQA, empty rows, huge scores.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

from attnlab.spec import reference
from attnlab.backends import kernel
from attnlab.backends.api import attention
from attnlab.spec.masks import causal_mask, window_mask

if kernel.isa() is None:
    if os.environ.get("CI"):  # CI builds it: a missing kernel there is a broken set-up, not a skip
        pytest.fail("attnlab.attention._tiles was not built (see pyproject.toml's ext-modules)", pytrace=False)
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)


@pytest.fixture(params=kernel._tiles.isas(), autouse=True)
def isa(request):
    """Every test once per instruction set compiled in that this CPU runs (AVX-512, AVX2, 128-bit)."""
    best = kernel._tiles.isa()
    kernel._tiles.isa(request.param)
    yield request.param
    kernel._tiles.isa(best)


def _data(name, b=2, hq=2, hkv=None, tq=97, tk=None, d=59, dv=None, spread=1.0):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    hkv, tk, dv = hkv or hq, tk or tq, dv or d
    q = (rng.standard_normal((b, hq, tq, d)) * spread).astype(np.float32)
    k = rng.standard_normal((b, hkv, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, tk, dv)).astype(np.float32)
    return q, k, v


def _expected(q, k, v, causal=False, window=None, lengths=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    tq, tk = q.shape[-2], k.shape[-2]
    allowed = np.ones((tq, tk), bool)
    if causal:
        allowed = allowed & causal_mask(tq, tk)
    if window is not None:
        left, right = window if isinstance(window, tuple) else (window, window)
        allowed = allowed & window_mask(tq, tk, left=left, right=right)
    if lengths is not None:
        allowed = allowed & (np.arange(tk) < np.asarray(lengths)[:, None, None, None])
    s = np.where(allowed, reference.scores(q, k), -np.inf)
    return reference.attention(q, k, v, mask=allowed), reference.logsumexp(s)


CASES = {
    "odd-97-d59": (_data("a"), {}),
    "d64-dv64-v-in-place": (_data("b", tq=300, d=64), {}),
    "dv24-padded": (_data("c", tq=45, tk=130, d=16, dv=24), {}),
    "causal-tq<tk-bottom-right": (_data("d", tq=33, tk=97, d=16, dv=40), {"causal": True}),
    "causal-tq>tk-empty-rows": (_data("e", tq=40, tk=25, d=8), {"causal": True}),
    "window": (_data("f", tq=300, d=16), {"window": (37, 5)}),
    "causal-window": (_data("g", tq=300, d=16), {"causal": True, "window": 20}),
    "lengths-0-and-37": (_data("h", tq=50, d=16), {"lengths": [0, 37]}),
    "gqa-causal": (_data("i", hq=6, hkv=2, tq=41, d=16), {"causal": True}),
    "n1025-causal": (_data("j", b=1, hq=1, tq=1025, d=64), {"causal": True}),
}


@pytest.mark.parametrize("block", [None, (16, 23), (7, 100), (1000, 5)], ids=["default", "16x23", "7x100", "1000x5"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_compiled_kernel_matches_the_float64_reference(case, block):
    (q, k, v), kw = case
    out, lse = attention(q, k, v, backend="blockwise", return_lse=True, block_size=block, **kw)
    expected, expected_lse = _expected(q, k, v, **kw)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=2e-6)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    np.testing.assert_allclose(np.nan_to_num(lse, neginf=0), np.nan_to_num(expected_lse, neginf=0), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_compiled_kernel_and_python_loop_agree_on_tensors(case, monkeypatch):
    torch = pytest.importorskip("torch")
    (q, k, v), kw = case
    q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    out = attention(q, k, v, backend="blockwise", **kw)
    monkeypatch.setattr(tiles, "ENABLED", False)
    loop = attention(q, k, v, backend="blockwise", **kw)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, loop, atol=2e-6, rtol=0)


def test_result_does_not_depend_on_the_thread_count(monkeypatch):
    q, k, v = _data("threads", b=3, hq=4, tq=257, d=64)
    two = attention(q, k, v, backend="blockwise", causal=True)
    monkeypatch.setattr(tiles, "THREADS", 1)
    one = attention(q, k, v, backend="blockwise", causal=True)
    np.testing.assert_array_equal(one, two)  # a query block is always one thread's: bit for bit


def test_huge_scores_neither_overflow_nor_lose_the_maximum():
    q, k, v = _data("huge", tq=200, d=32, spread=3e3)  # scores up to ~1e5: exp of anything but the max is 0
    out = attention(q, k, v, backend="blockwise")
    expected, _ = _expected(q, k, v)
    assert np.isfinite(out).all()
    # float32 rounds a score of 1e5 by ~0.004, which moves the weights: judge against plain float32 math
    s = q @ np.swapaxes(k, -1, -2) / np.float32(np.sqrt(32))
    e = np.exp(s - s.max(-1, keepdims=True))
    plain = (e / e.sum(-1, keepdims=True)) @ v
    assert np.abs(out - expected).max() <= 2 * np.abs(plain - expected).max() + 1e-6


def test_exp2_polynomial_is_accurate_and_exactly_zero_for_hidden_scores():
    # one query against keys with scores 0, -1/4, ..., down to -150 (base 2), and a hidden tail
    d, n = 1, 700
    q = np.ones((1, 1, 1, d), np.float32)
    k = (-np.arange(n, dtype=np.float32) / 4).reshape(1, 1, n, d) / np.float32(np.log2(np.e))
    v = np.eye(n, dtype=np.float32).reshape(1, 1, n, n)
    out = attention(q, k, v, backend="blockwise", scale=1.0, lengths=[650])  # out[j] is weight j
    w = out[0, 0, 0]
    exact = 2.0 ** (-np.arange(650) / 4) / np.sum(2.0 ** (-np.arange(650) / 4))
    np.testing.assert_allclose(w[:650], exact, rtol=3e-6, atol=1e-30)
    assert (w[650:] == 0).all() and (w[:650] > 0).sum() >= 4 * 126  # below 2^-126 float32 flushes to 0


def test_what_it_refuses_goes_through_the_python_loop():
    q, k, v = _data("refuse", tq=20, d=8)
    assert kernel.refusal("cpu", "float32", masked=False) is None
    assert "float32 on the CPU only, got float64 on cpu" in kernel.refusal("cpu", "float64", masked=False)
    assert "float32 on the CPU only" in kernel.refusal("cuda:0", "float32", masked=False)
    assert "mask" in kernel.refusal("cpu", "float32", masked=True)
    out = attention(q, k, v, backend="blockwise", mask=np.tril(np.ones((20, 20), bool)))  # served by the loop
    np.testing.assert_allclose(out, _expected(q, k, v, causal=True)[0], atol=2e-6)


def test_bad_buffers_raise_instead_of_reading_past_them():
    q = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="k: expected a C-contiguous buffer of 32 items"):
        kernel._tiles.forward(q, np.zeros(3, np.float32), q[0, 0], np.empty_like(q), np.empty((1, 1, 4), np.float32),
                             None, 1, 1, 4, 4, 8, 8, 1.0, -1, -1, 4, 4, 1)


def test_an_instruction_set_this_cpu_lacks_is_refused():
    with pytest.raises(ValueError, match="this CPU or build has no 'SVE'"):
        kernel._tiles.isa("SVE")


def test_torch_set_num_threads_reaches_the_kernel():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        # torch sets OpenMP's default in the one libgomp the process has; the kernel (THREADS = None) takes it
        torch.set_num_threads(1)
        assert kernel._tiles.default_threads() == 1
        torch.set_num_threads(2)
        assert kernel._tiles.default_threads() == 2
    finally:
        torch.set_num_threads(before)
