"""The compiled decode pass (``kernel.decode``, ``_tiles_decode.h``) against the float64 reference.

Few query rows against a cache ``[B, H_kv, Tk, D]`` with per-sequence lengths: query i of sequence b
sits at lengths[b] − Tq + i, its band measured from there (the mask is built here, from that rule).
Every test runs once per instruction-set variant this CPU runs. 16-bit caches are compared with the
reference on their rounded values; chunks and merge order follow the shapes, so 1, 2 and 16 threads
give the same bits; bad arguments are refused naming them before anything is read.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

from attnlab.backends import kernel
from attnlab.backends.api import attention
from attnlab.reference import attention as reference

if kernel.isa() is None:
    if os.environ.get("CI"):
        pytest.fail("attnlab.backends.kernel._tiles was not built (see pyproject.toml's ext-modules)", pytrace=False)
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)

def _cache(name, b=2, h=8, hkv=2, tq=1, tk=97, d=64, dv=None):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, tk, dv or d)).astype(np.float32)
    return q, k, v


def _expected(q, k, v, lengths=None, causal=False, window=None):
    """float64 out and LSE, the mask from the per-sequence rule: query i of b at lengths[b] − Tq + i."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, h, tq, _ = q.shape
    tk, g = k.shape[2], h // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # (B, H, Tk, ·)
    n = np.full(b, tk) if lengths is None else np.asarray(lengths)
    pos = (n - tq)[:, None, None] + np.arange(tq)[None, :, None]  # (B, Tq, 1)
    j = np.arange(tk)[None, None, :]  # (1, 1, Tk)
    allowed = j < n[:, None, None]
    left, right = _band(causal, window)
    if left is not None:
        allowed = allowed & (j >= pos - left)
    if right is not None:
        allowed = allowed & (j <= pos + right)
    allowed = allowed[:, None]  # (B, 1, Tq, Tk)
    s = np.where(allowed, reference.scores(q, k), -np.inf)
    return reference.attention(q, k, v, mask=allowed), reference.logsumexp(s)


def _band(causal, window):
    """(left, right): query i sees keys pos(i) − left .. pos(i) + right (None: unbounded; causal cuts right at 0)."""
    w = None if window is None else tuple(window) if isinstance(window, (tuple, list)) else (window, window)
    right = 0 if causal else None
    if w is not None:
        right = w[1] if right is None else min(right, w[1])
    return (None if w is None else w[0]), right


def _check(got, want, tol=2e-5):
    (out, lse), (want_out, want_lse) = got, want
    np.testing.assert_allclose(out, want_out, atol=tol, rtol=0)
    empty = np.isneginf(want_lse)
    assert np.isneginf(lse[empty]).all() and (out[empty] == 0).all()
    np.testing.assert_allclose(lse[~empty], want_lse[~empty], atol=tol, rtol=0)


CASES = {  # (shapes, decode's arguments)
    "mha-tq1-97": ({"h": 4, "hkv": 4, "tk": 97, "d": 59, "dv": 40}, {"causal": True}),
    "gqa4-tq1-4099-ragged": ({"b": 3, "tk": 4099, "d": 64}, {"causal": True, "lengths": [0, 4099, 1234]}),
    "gqa8-tq4-causal-ragged": ({"b": 2, "h": 16, "hkv": 2, "tq": 4, "tk": 1500, "d": 32}, {"causal": True, "lengths": [3, 1500]}),
    "gqa4-tq4-window": ({"tq": 4, "tk": 3000, "d": 16}, {"causal": True, "window": (700, 0), "lengths": [2999, 1800]}),
    "gqa1-tq4-two-sided-window": ({"h": 2, "hkv": 2, "tq": 4, "tk": 600, "d": 24}, {"window": (50, 7), "lengths": [600, 99]}),
    "gqa8-full-no-lengths": ({"b": 1, "h": 8, "hkv": 1, "tq": 3, "tk": 513, "d": 128}, {}),
    "tq-beyond-lengths": ({"tq": 4, "tk": 40, "d": 8}, {"causal": True, "lengths": [2, 0]}),
    "one-head-100003": ({"b": 1, "h": 4, "hkv": 1, "tk": 100_003, "d": 16}, {"causal": True}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decode_matches_the_float64_reference(case, isa):
    shapes, kw = case[0], dict(case[1])
    lengths = kw.pop("lengths", None)
    q, k, v = _cache(str(shapes), **shapes)
    got = kernel.decode(q, k, v, None if lengths is None else np.array(lengths), scale=0.125, **kw)
    want_q = q * (0.125 * np.sqrt(q.shape[-1]))  # the reference scales by 1/sqrt(D)
    _check(got, _expected(want_q, k, v, lengths, **kw))


@pytest.mark.parametrize("threads", [1, 2, 16])
def test_the_same_bits_for_any_thread_count(threads, isa):
    q, k, v = _cache("threads", b=1, h=32, hkv=8, tq=4, tk=9000, d=128)
    lengths = np.array([8999])
    want = kernel.decode(q, k, v, lengths, scale=0.09, causal=True, threads=1)
    got = kernel.decode(q, k, v, lengths, scale=0.09, causal=True, threads=threads)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_slice_of_a_longer_cache_is_read_in_place(isa):
    q, k, v = _cache("slice", b=2, h=8, hkv=2, tq=1, tk=1000, d=64)
    ks, vs = k[:, :, :700], v[:, :, :700]  # (B, H_kv, 700, D) views, heads 1000 rows apart
    assert not ks.flags.c_contiguous
    got = kernel.decode(q, ks, vs, np.array([700, 300]), scale=0.125, causal=True)
    want = kernel.decode(q, ks.copy(), vs.copy(), np.array([700, 300]), scale=0.125, causal=True)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("d", [72, 64])  # values staged in L1 (padded to whole vectors) or converted as read
def test_float16_caches_match_the_reference_on_their_rounded_values(d, isa):
    q, k, v = _cache("f16", b=2, tq=4, tk=2100, d=d)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    for query in (q, q.astype(np.float16)):
        got = kernel.decode(query, k16, v16, np.array([2100, 77]), scale=1 / np.sqrt(d), causal=True)
        _check(got, _expected(query, k16, v16, [2100, 77], causal=True))


@pytest.mark.needs("torch")
def test_bfloat16_caches_match_the_reference_on_their_rounded_values(isa):
    import torch

    q, k, v = (torch.from_numpy(x) for x in _cache("bf16", b=2, h=16, hkv=2, tq=4, tk=2100, d=128))
    kb, vb = k.bfloat16(), v.bfloat16()
    for query in (q, q.bfloat16()):
        out, lse = kernel.decode(query, kb, vb, torch.tensor([2100, 5]), scale=1 / np.sqrt(128), causal=True)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
        rounded = [x.float().numpy() for x in (query, kb, vb)]
        _check((out.numpy(), lse.numpy()), _expected(*rounded, [2100, 5], causal=True))


def test_subnormal_and_extreme_float16_values_convert_exactly(isa):
    values = np.array([6e-8, -6e-8, 1e-5, 65504.0, -65504.0, 0.0, -0.0, 1.0], np.float16)
    k = np.zeros((1, 1, 8, 16), np.float16)
    v = np.repeat(values[:, None], 16, axis=1)[None, None]  # value row j is values[j]
    q = np.zeros((1, 1, 8, 16), np.float32)
    lengths = np.array([8])
    out, _ = kernel.decode(q, k, v, lengths, scale=1.0, window=(0, 0))  # query i sees key i alone
    np.testing.assert_array_equal(out[0, 0, :, 0], values.astype(np.float32))


pass_decode = kernel._tiles.decode if kernel._tiles is not None else None  # the compiled pass every decode call makes


@pytest.mark.needs("torch")
def test_the_kernel_backend_serves_few_rows_by_the_decode_pass(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(kernel._tiles, "decode", lambda *a, **kw: calls.append(kw) or pass_decode(*a, **kw))
    q, k, v = (torch.from_numpy(x) for x in _cache("backend", b=2, h=8, hkv=2, tq=1, tk=300, d=32))
    lengths = torch.tensor([300, 120])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = [t.to(dtype) for t in (q, k, v)]
        out, lse = attention(*x, lengths=lengths, causal=True, backend="kernel", return_lse=True)
        assert out.dtype == dtype and lse.dtype == dtype
        want = _expected(*(t.float().numpy() for t in x), [300, 120], causal=True)
        _check((out.float().numpy(), lse.float().numpy()), want, tol=2e-5 if dtype == torch.float32 else 2e-2)
    assert len(calls) == 3
    rows = kernel.DECODE_MAX_TQ + 1  # beyond the crossover: the tiles path
    attention(q.expand(2, 8, rows, 32).contiguous(), k, v, backend="kernel")
    assert len(calls) == 3


def test_chosen_rows_weights_come_from_the_decode_pass(monkeypatch):
    """weights_rows= on few rows (generate's maps and h2o ask for the newest row's each step): the decode pass, its
    LSE turning each row's scores into its weights; against the float64 reference with GQA, ragged lengths, a
    window and learned sinks (whose share leaves the keys' weights summing below 1)."""
    import torch

    calls = []
    monkeypatch.setattr(kernel._tiles, "decode", lambda *a, **kw: calls.append(kw) or pass_decode(*a, **kw))
    monkeypatch.setattr(kernel._tiles, "forward", None)  # the tiles path would fail
    q, k, v = (torch.from_numpy(x) for x in _cache("rows", b=2, h=8, hkv=2, tq=3, tk=300, d=32))
    lengths, sinks = torch.tensor([300, 120]), torch.linspace(-1.0, 2.0, 8)
    for kw in ({}, {"lengths": lengths, "causal": True}, {"causal": True, "window": (50, 0), "sink_logits": sinks}):
        out, w = attention(q, k, v, backend="kernel", weights_rows=[0, 2], **kw)
        ref_out, ref_w = attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), backend="numpy",
                                   weights_rows=[0, 2], **{n: x.numpy() if hasattr(x, "numpy") else x for n, x in kw.items()})
        np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-5)
        np.testing.assert_allclose(w.numpy(), ref_w, atol=2e-6)
        assert w.shape == (2, 8, 2, 300)
    assert len(calls) == 3


def _args(**change):
    args = dict(q=np.zeros((1, 4, 1, 8), np.float32), k=np.zeros((1, 2, 5, 8), np.float32),
                v=np.zeros((1, 2, 5, 3), np.float32), out=np.empty((1, 4, 1, 3), np.float32),
                lse=np.empty((1, 4, 1), np.float32), dtype="float32", scale=1.0, threads=0,
                spans=np.array([[[[0, 5, 0, 0]]]], np.int64))
    return {**args, **change}


def test_a_valid_direct_call_runs(isa):
    args = _args(v=np.ones((1, 2, 5, 3), np.float32))
    kernel._tiles.decode(**args)
    assert (args["out"] == 1).all() and np.allclose(args["lse"], np.log(5))


@pytest.mark.parametrize("change, text", [
    ({"spans": np.array([[[[0, 6, 0, 0]]]], np.int64)}, "spans: expected sorted, separate key intervals inside 0..Tk=5"),
    ({"spans": np.array([[[[-1, 5, 0, 0]]]], np.int64)}, "spans: expected sorted, separate key intervals"),
    ({"spans": np.array([[[[0, 3, 2, 5]]]], np.int64)}, "spans: expected sorted, separate key intervals"),
    ({"spans": np.zeros((2, 1, 1, 4), np.int64)}, "spans: expected leading dims (1 or B=1, 1 or H=4), got (2, 1)"),
    ({"spans": np.zeros((1, 1, 1, 4), np.int32)}, "spans: expected int64 items"),
    ({"sinks": np.zeros((1, 3), np.float32)}, "sinks: expected leading dims (1 or B=1, 1 or H=4), got (1, 3)"),
    ({"q": np.zeros((1, 3, 1, 8), np.float32), "out": np.empty((1, 3, 1, 3), np.float32),
      "lse": np.empty((1, 3, 1), np.float32)}, "q: expected a multiple of k's 2 key/value heads (dim 1), got 3 heads"),
    ({"k": np.zeros((1, 2, 5, 8))}, "k: expected float32 items (buffer format 'f'), got format 'd'"),
    ({"dtype": "float64"}, "dtype: expected 'float32', 'float16', 'bfloat16', 'int8', 'float8_e4m3fn' or 'int4'"),
    ({"dtype": "bfloat16"}, "k: expected bfloat16 items (buffer format 'h' or 'H' holding its bits), got format 'f'"),
    ({"dtype": "float16", "k": np.zeros((1, 2, 5, 8), np.float16)}, "v: expected float16 items"),
    ({"k": np.zeros((1, 2, 8, 5), np.float32).swapaxes(-1, -2)}, "k: expected a row-contiguous"),
    ({"v": np.zeros((1, 2, 5, 6), np.float32)[..., ::2]}, "v: expected a row-contiguous"),
    ({"k": np.zeros((1, 4, 5, 8), np.float32)[:, ::-2]}, "k: expected a row-contiguous"),
    ({"q": np.zeros((1, 4, 1, 16), np.float32)[..., ::2]}, "q: expected a C-contiguous array"),
    ({"v": np.zeros((1, 2, 6, 3), np.float32)}, "v: expected shape (B=1, N=2, K=5, V), got (1, 2, 6, 3)"),
    ({"out": np.empty((1, 4, 1, 3), np.float32)[:, :, :, ::-1]}, "out: expected a C-contiguous array"),
    ({"lse": np.empty((1, 4, 2), np.float32)}, "lse: expected shape (B=1, H=4, T=1), got (1, 4, 2)"),
    ({"threads": -1}, "threads: expected >= 0"),
])
def test_bad_arguments_raise_naming_them_before_reading(change, text):
    with pytest.raises(ValueError) as e:
        kernel._tiles.decode(**_args(**change))
    assert text in str(e.value)


def test_the_wrapper_refuses_what_it_does_not_read():
    q, k, v = _cache("bad", tq=1, tk=10, d=8)
    with pytest.raises(TypeError, match=r"k and v must share one dtype of float32, float16, bfloat16 \(or int8 or float8_e4m3fn with k_scale and v_scale\), got k float64"):
        kernel.decode(q, k.astype(np.float64), v, scale=1.0)
    with pytest.raises(TypeError, match=r"q must be float32 or k's dtype \(float16\), got float64"):
        kernel.decode(q.astype(np.float64), k.astype(np.float16), v.astype(np.float16), scale=1.0)
    with pytest.raises(ValueError, match=r"q must have shape \(B, H, Tq, D\), got \(8, 1, 8\)"):
        kernel.decode(q[0], k, v, scale=1.0)


@pytest.mark.needs("torch")
@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_a_float32_query_over_a_16_bit_cache_is_read_as_stored(kv, monkeypatch):
    """attention()'s kv_dtype call: the decode pass reads the cache as it is, the result in q's float32."""
    import torch

    seen = []
    real = kernel._stored
    monkeypatch.setattr(kernel, "_stored", lambda x: seen.append(x.dtype) or real(x))
    q, k, v = (torch.from_numpy(x) for x in _cache("kv-dtype", b=2, h=8, hkv=2, tq=1, tk=700, d=64))
    k16, v16 = k.to(getattr(torch, kv)), v.to(getattr(torch, kv))
    out = attention(q, k16, v16, lengths=torch.tensor([700, 33]), causal=True, backend="kernel")
    assert out.dtype == torch.float32 and seen == [getattr(torch, kv)] * 2
    want, _ = _expected(q.numpy(), k16.float().numpy(), v16.float().numpy(), [700, 33], causal=True)
    np.testing.assert_allclose(out.numpy(), want, atol=2e-5, rtol=0)


@pytest.mark.needs("torch")
def test_ragged_causal_windows_go_through_the_decode_pass_as_attention_defines_them(monkeypatch):
    """causal with lengths is each sequence's own (query i of b at lengths[b] − Tq + i): decode's rule."""
    import torch

    calls = []
    monkeypatch.setattr(kernel._tiles, "decode", lambda *a, **kw: calls.append(1) or pass_decode(*a, **kw))
    q, k, v = (torch.from_numpy(x) for x in _cache("ragged", b=3, h=8, hkv=2, tq=4, tk=900, d=32))
    lengths = [900, 2, 401]
    out = attention(q, k, v, lengths=torch.tensor(lengths), causal=True, window=(100, 0), backend="kernel")
    want, _ = _expected(q.numpy(), k.numpy(), v.numpy(), lengths, causal=True, window=(100, 0))
    np.testing.assert_allclose(out.numpy(), want, atol=2e-5, rtol=0)
    assert calls == [1]
