"""The blockwise loop itself: gradients, stability, tile skipping, and memory that grows with T, not T²."""

from __future__ import annotations

import tracemalloc

import numpy as np

from attnlab import masks
from attnlab.reference.masks import causal_mask
import pytest

from attnlab.backends import online, tiling
from attnlab.backends.agreement import reference_of
from attnlab.backends.api import attention
from attnlab.reference import attention as reference

try:
    import torch
except ImportError:  # the tests that need it are marked needs("torch")
    torch = None

needs_torch = pytest.mark.needs("torch")
KINDS = ["numpy", pytest.param("torch", marks=needs_torch)]


def _qkv(*shape_q, tk=None, hkv=None, dv=None, seed=0, dtype="float64"):
    g = torch.Generator().manual_seed(seed)
    b, h, tq, d = shape_q
    kshape = (b, hkv or h, tk or tq)
    dtype = getattr(torch, dtype)
    q = torch.randn(b, h, tq, d, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(*kshape, d, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(*kshape, dv or d, generator=g, dtype=dtype, requires_grad=True)
    return q, k, v


def _grad_case(name):
    """attention()'s options for the gradient tests, on q (1, 2, 7, ·) and k, v (1, 1, 9, ·)."""
    rng = np.random.default_rng(1)
    return {
        "plain": {},
        "causal-tq<tk": {"causal": True},
        "window-lengths": {"window": (3, 1), "lengths": np.array([8])},
        "mask-bias": {"mask": torch.from_numpy(rng.random((7, 9)) > 0.3), "bias": torch.from_numpy(rng.standard_normal((7, 9)))},
    }[name]


GRAD_CASES = ["plain", "causal-tq<tk", "window-lengths", "mask-bias"]


@needs_torch
@pytest.mark.parametrize("name", GRAD_CASES)
def test_backward_passes_gradcheck_in_float64(name):
    kw = _grad_case(name)
    q, k, v = _qkv(1, 2, 7, 3, tk=9, hkv=1, dv=2)  # grouped-query: 2 query heads over 1 k/v head

    def f(q, k, v):
        return attention(q, k, v, backend="blockwise", block_size=(3, 4), return_lse=True, **kw)

    assert torch.autograd.gradcheck(f, (q, k, v))


@needs_torch
@pytest.mark.parametrize("name", GRAD_CASES)
def test_backward_agrees_with_autograd_through_the_torch_backend(name):
    kw = _grad_case(name)
    q, k, v = _qkv(1, 4, 7, 6, tk=9, hkv=2, dv=5, seed=3)
    g = torch.Generator().manual_seed(4)
    dout, dlse = torch.randn(1, 4, 7, 5, generator=g, dtype=torch.float64), torch.randn(1, 4, 7, generator=g, dtype=torch.float64)

    def grads(backend, **extra):
        out, lse = attention(q, k, v, backend=backend, return_lse=True, **kw, **extra)
        loss = (out * dout).sum() + (lse * dlse).sum()
        return torch.autograd.grad(loss, (q, k, v))

    for mine, theirs in zip(grads("blockwise", block_size=(3, 4)), grads("torch")):
        torch.testing.assert_close(mine, theirs, atol=1e-12, rtol=1e-10)


@needs_torch
def test_float32_gradients_match_sdpa():
    q, k, v = _qkv(1, 2, 300, 32, dtype="float32", seed=5)
    go = torch.randn(1, 2, 300, 32)
    a = torch.autograd.grad((attention(q, k, v, causal=True, backend="blockwise", block_size=64) * go).sum(), (q, k, v))
    b = torch.autograd.grad((attention(q, k, v, causal=True, backend="sdpa") * go).sum(), (q, k, v))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_scores_of_1e4_and_a_maximum_that_keeps_rising(kind):
    """Keys sorted by growing score: every tile raises the rows' maximum, so every rescale path runs."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 40, 16)) * 30
    k = np.sort(rng.standard_normal((1, 300, 16)), axis=1) * 30  # scores up to ~1e4
    v = rng.standard_normal((1, 300, 8))
    bias = np.linspace(0, 500, 300)[None, None, :] * np.ones((1, 40, 1))  # large positive bias, too
    expected = reference.attention(q, k, v, bias=bias)
    if kind == "torch":
        q, k, v, bias = (torch.from_numpy(x) for x in (q, k, v, bias))
    out = attention(q, k, v, bias=bias, backend="blockwise", block_size=(8, 32))
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-9)


def test_causal_visits_about_half_the_tiles_and_windows_fewer():
    def pairs(left, right, t=4096, bq=256, bk=512):
        band = tiling.Tiling.of(t, t, masks.window(left, right))
        return sum((k1 - k0) * (min(i0 + bq, t) - i0) for i0 in range(0, t, bq) for k0, k1, _ in band.key_blocks(i0, min(i0 + bq, t), bk))

    full = pairs(None, None)
    assert full == 4096 * 4096
    # the last tile of each query block is cut at the diagonal: a half plus bq / 2 per row
    assert 0.5 <= pairs(None, 0) / full <= 0.5 + 256 / (2 * 4096) + 1e-3
    assert pairs(128, 0) / full < 0.1  # a 128-key causal window: (128 + 256) keys per block of 256 queries


def test_numpy_loop_memory_grows_with_t_not_t_squared():
    """n = 4096 in float64: the (n, n) scores alone would be 128 MB; the loop stays near its tiles."""
    n, d = 4096, 16
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    tracemalloc.start()
    out = attention(q, k, v, causal=True, backend="blockwise")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tile = tiling.TILE_ELEMENTS * 8
    assert peak < 4 * tile + 20 * n * d * 8, f"peak {peak / 2**20:.1f} MB"
    rows = [0, 2047, 4095]
    np.testing.assert_allclose(out[rows], reference.attention(q[rows], k, v, mask=causal_mask(n)[rows]), atol=1e-12)


@needs_torch
def test_rows_of_weights_sum_to_one_and_match_the_reference():
    q, k, v = (x.detach() for x in _qkv(1, 3, 50, 8, tk=70, seed=9))
    out, w = attention(q, k, v, causal=True, weights_rows=[0, 49], backend="blockwise", block_size=7)
    _, ref_w = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=True, return_weights=True)
    np.testing.assert_allclose(w.numpy(), ref_w[..., [0, 49], :], atol=1e-12)
    np.testing.assert_allclose(w.sum(-1).numpy(), 1.0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_merging_two_halves_of_the_keys_by_their_lse_gives_the_whole(kind):
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 30, 8)), rng.standard_normal((2, 50, 8)), rng.standard_normal((2, 50, 5))
    mask = np.ones((30, 50), bool)
    mask[3] = False  # a row with nothing in either half
    mask[4, :20] = False  # a row with nothing in the first half
    expected = reference.attention(q, k, v, mask=mask)
    if kind == "torch":
        q, k, v, mask = (torch.from_numpy(x) for x in (q, k, v, mask))
    a = attention(q, k[:, :20], v[:, :20], mask=mask[:, :20], backend="blockwise", return_lse=True)
    b = attention(q, k[:, 20:], v[:, 20:], mask=mask[:, 20:], backend="blockwise", return_lse=True)
    out, lse = online.merge(*a, *b)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-12)
    assert np.isneginf(np.asarray(lse)[:, 3]).all() and np.isfinite(np.asarray(lse)[:, 4]).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": (20, 3)}, {"causal": True, "lengths": np.array([70, 90])}],
                         ids=["causal", "window", "causal-lengths"])
def test_band_edge_tiles_split_into_row_parts_agree_with_the_reference(kind, kw):
    """Query blocks larger than half a key block: the tiles on the band's edge go in row parts, each cut where the band ends."""
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((2, 97, 8)), rng.standard_normal((2, 113, 8)), rng.standard_normal((2, 113, 8))  # Tq ≠ Tk
    ref, ref_lse = reference_of(q, k, v, return_lse=True, **kw)
    if kind == "torch":
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    out, lse = attention(q, k, v, backend="blockwise", block_size=(48, 16), return_lse=True, **kw)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(np.asarray(lse)), np.isneginf(ref_lse))
    np.testing.assert_allclose(np.nan_to_num(np.asarray(lse), neginf=0), np.nan_to_num(ref_lse, neginf=0), atol=1e-12)
