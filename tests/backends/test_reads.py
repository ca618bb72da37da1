"""A generation's reads (attnlab.backends.reads.Reads) give what attention_read gives, bit for bit, step after
step across length buckets: float32 and 16-bit caches, GQA, learned sinks, ragged batches, every backend; the
direct calls are taken where auto (or the named backend) chose the kernel's decode pass or SDPA, and stood aside
from where the score bound is large, q is not finite, or the read says more than a plain one."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def _cache(dtype, n=300, heads=(8, 2), d=32, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    h, hkv = heads
    q = torch.randn(1, h, 1, d, generator=g)
    k, v = (torch.randn(1, hkv, n, d, generator=g).to(getattr(torch, dtype)) for _ in range(2))
    return q, k, v


def _kw(k, **more):
    from attnlab.backends.request import max_norm

    return {"mask": None, "lengths": None, "causal": True, "kv_checked": True, "k_norm": max_norm(k), **more}


def _steps(backend, dtype, sizes, **more):
    """(reads' output, attention_read's) at each cache length, and the Reads."""
    import torch

    from attnlab.backends.api import attention_read
    from attnlab.backends.options import Options
    from attnlab.backends.reads import Reads

    q, k, v = _cache(dtype)
    reads, pairs = Reads(backend), []
    for i, n in enumerate(sizes):
        qi = q * (1 + i / 10)  # a new query each step
        kw = _kw(k, **more)
        got = reads(0, qi, k[:, :, :n], v[:, :, :n], kw)
        want = attention_read(qi, k[:, :, :n], v[:, :, :n], Options.of(kw), backend)[0]
        pairs.append((got, want))
    assert all(g.dtype == w.dtype == torch.float32 and torch.equal(g, w) for g, w in pairs)
    return reads


LENGTHS = [1, 2, 3, 17, 31, 32, 33, 64, 65, 100, 128, 129, 300]  # buckets 1 … 512, several steps in some


@pytest.mark.parametrize("backend, dtype", [(b, d) for b in ("auto", "kernel", "torch", "blockwise")
                                            for d in ("float32", "bfloat16", "float16")] + [("sdpa", "float32")])
def test_each_step_equals_attention_read_bit_for_bit(backend, dtype):
    if backend == "kernel":
        pytest.importorskip("attnlab.backends.kernel._tiles")
    reads = _steps(backend, dtype, LENGTHS)
    kinds = {type(direct).__name__ for _, direct in reads.kept.values()}
    if backend == "kernel":
        assert kinds == {"_KernelRead"}  # every bucket's later steps called the decode pass directly
    if backend == "sdpa":
        assert kinds == {"_SdpaRead"}
    if backend in ("torch", "blockwise"):
        assert kinds == {"NoneType"}


def test_learned_sinks_go_to_the_decode_pass_as_decode_passes_them():
    pytest.importorskip("attnlab.backends.kernel._tiles")
    import torch

    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, -0.5, 0.25, 3.0])
    reads = _steps("kernel", "bfloat16", LENGTHS, sink_logits=sinks)
    assert {type(d).__name__ for _, d in reads.kept.values()} == {"_KernelRead"}


def test_a_read_with_more_to_say_goes_through_attention_read():
    import torch

    from attnlab import masks

    reads = _steps("auto", "float32", [40, 50, 60], mask=masks.sliding_window(8))
    assert not reads.kept
    from attnlab.backends.reads import Reads

    q, k, v = _cache("float32")
    reads = Reads("auto")
    with pytest.raises(ValueError, match="lengths"):  # not one per sequence: attention_read's refusal
        reads(0, q, k, v, _kw(k, lengths=torch.tensor([37, 40])))
    assert not reads.kept


@pytest.mark.parametrize("backend, dtype", [("kernel", "float32"), ("kernel", "bfloat16"), ("auto", "float16"),
                                            ("torch", "float32"), ("sdpa", "float32")])
def test_a_ragged_batchs_steps_equal_attention_read_bit_for_bit(backend, dtype):
    """Three sequences of their own lengths (one empty at first, one stopped), the cache as long as the longest:
    the decode pass called directly with each row's keys [0, lengths[b]) gives attention_read's bits."""
    import torch

    from attnlab.backends.api import attention_read
    from attnlab.backends.options import Options
    from attnlab.backends.reads import Reads

    if backend == "kernel":
        pytest.importorskip("attnlab.backends.kernel._tiles")
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 8, 1, 32, generator=g)
    k, v = (torch.randn(3, 2, 300, 32, generator=g).to(getattr(torch, dtype)) for _ in range(2))
    reads = Reads(backend)
    for i, n in enumerate(LENGTHS):
        lengths = torch.tensor([n, max(n - 20, 0), min(n, 33)])
        kw = _kw(k, lengths=lengths)
        qi, ki, vi = q * (1 + i / 10), k[:, :, :n], v[:, :, :n]
        got = reads(0, qi, ki, vi, kw)
        assert torch.equal(got, attention_read(qi, ki, vi, Options.of(kw), backend)[0])
    kinds = {type(direct).__name__ for _, direct in reads.kept.values()}
    want = {"kernel": {"_KernelRead"}, "torch": {"NoneType"}, "sdpa": {"NoneType"}}.get(backend)  # auto: its choice
    assert reads.kept and (want is None or kinds == want)


def test_a_read_of_keys_not_checked_is_attention_itself():
    import torch

    from attnlab.backends.api import attention
    from attnlab.backends.reads import Reads

    q, k, v = _cache("float32")
    k[0, 1, 5, 3] = float("nan")
    with pytest.raises(ValueError, match=r"\bk\b.*finite"):
        attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match=r"\bk\b.*finite"):
        Reads()(0, q, k, v, {"causal": True})
    k[0, 1, 5, 3] = 0.0
    assert torch.equal(Reads()(0, q, k, v, {"causal": True}), attention(q, k, v, causal=True))


def test_a_large_bound_or_a_non_finite_query_leaves_the_direct_call():
    import math

    from attnlab.backends.api import attention_read
    from attnlab.backends.options import Options
    from attnlab.backends.reads import Reads

    q, k, v = _cache("float32")
    reads = Reads("auto")
    for n in (33, 40):  # the bucket's choice, then its direct call
        reads(0, q, k[:, :, :n], v[:, :, :n], _kw(k))
    assert reads.kept
    big = q * 1e4  # a bound past CHEAP_BOUND_OK: the checks and auto's choice again, as attention_read makes them
    kw = _kw(k)
    assert reads(0, big, k[:, :, :50], v[:, :, :50], kw).equal(attention_read(big, k[:, :, :50], v[:, :, :50],
                                                                               Options.of(kw), "auto")[0])
    bad = q.clone()
    bad[0, 3, 0, 7] = math.nan
    with pytest.raises(ValueError, match=r"\bq\b.*finite"):
        reads(0, bad, k[:, :, :50], v[:, :, :50], kw)


@pytest.mark.needs("kernel")
def test_the_kernels_max_norm_is_the_bounds_query_norm():
    """_tiles.max_norm (the kernel read's bound, no torch call): request.max_norm's value, NaN and inf carried,
    0 when empty, anything but float32 refused."""
    import numpy as np

    from attnlab.backends.kernel import _tiles
    from attnlab.backends.request import max_norm

    x = np.random.default_rng(0).standard_normal((2, 8, 3, 64)).astype(np.float32)
    assert _tiles.max_norm(x) == pytest.approx(max_norm(x), rel=1e-6)
    assert _tiles.max_norm(np.zeros((0, 4), np.float32)) == 0.0
    for bad, want in ((np.nan, np.isnan), (np.inf, np.isinf)):
        y = x.copy()
        y[1, 7, 2, 5] = bad
        assert want(_tiles.max_norm(y))
    with pytest.raises(TypeError, match="float32 C-contiguous"):
        _tiles.max_norm(x.astype(np.float64))
