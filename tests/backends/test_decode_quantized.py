"""The compiled decode pass over int8 and float8_e4m3fn caches (``kernel.decode(..., k_scale=, v_scale=)``): codes
read as stored and dequantized in registers (code · the key's or value row's scale; float8: the head's), against
the float64 reference on the dequantized keys and values. Every test runs once per instruction-set variant this
CPU runs; int4's tests on AMX, where it is here, also with it turned off."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import masks
from attnlab.backends import kernel
from attnlab.backends.request import Unchecked
from attnlab.reference import attention as reference

if kernel.isa() is None:
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)


def _int8(x):
    """Symmetric int8 with one scale per row (the quantized cache's "int8"): codes, scales, dequantized float64."""
    scale = (np.abs(x).max(-1) / 127).astype(np.float32)
    codes = np.round(x / np.where(scale == 0, 1, scale)[..., None]).astype(np.int8)
    return codes, scale, codes.astype(np.float64) * scale[..., None].astype(np.float64)


def _want(q, k, v, lengths, window=None):
    b, h, tq, _ = q.shape
    g, tk = h // k.shape[1], k.shape[2]
    pos = (lengths - tq)[:, None, None] + np.arange(tq)[None, :, None]
    j = np.arange(tk)[None, None, :]
    allowed = (j < lengths[:, None, None]) & (j <= pos)
    if window is not None:
        allowed &= j >= pos - window
    return reference.attention(q.astype(np.float64), np.repeat(k, g, 1), np.repeat(v, g, 1), mask=allowed[:, None],
                               scale=0.125)


@pytest.mark.parametrize("b, h, hkv, tq, tk, d, window", [
    (2, 8, 2, 1, 1000, 64, None),  # GQA, ragged lengths
    (1, 4, 4, 3, 77, 16, None),  # three rows, a partial last block
    (1, 6, 2, 2, 333, 20, 50),  # a head width that is not whole vectors (staged), a window
    (2, 32, 8, 1, 2100, 128, None),  # the decode benchmark's heads
])
def test_an_int8_cache_gives_the_reference_on_its_dequantized_values(isa, b, h, hkv, tq, tk, d, window):
    rng = np.random.default_rng(tk + d)
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    (kc, ks, k), (vc, vs, v) = (_int8(rng.standard_normal((b, hkv, tk, d)).astype(np.float32)) for _ in "kv")
    lengths = np.array([tk, tk // 2 + 1][:b])
    out, lse = kernel.decode(q, kc, vc, lengths, scale=0.125, causal=True, window=None if window is None else (window, 0),
                             k_scale=ks, v_scale=vs)
    np.testing.assert_allclose(out, _want(q, k, v, lengths, window), atol=2e-6)
    assert np.isfinite(lse).all()


def test_int8_codes_need_their_scales_and_float_caches_take_none():
    q = np.zeros((1, 2, 1, 8), np.float32)
    codes, scale, _ = _int8(np.ones((1, 1, 5, 8), np.float32))
    with pytest.raises(TypeError, match="got k int8 and v int8"):
        kernel.decode(q, codes, codes, scale=1.0)
    args = dict(q=q, k=codes, v=codes, out=np.empty((1, 2, 1, 8), np.float32), lse=np.empty((1, 2, 1), np.float32),
                dtype="int8", scale=1.0, threads=0)
    with pytest.raises(ValueError, match="v_scale: expected float32 scales"):
        kernel._tiles.decode(**args, k_scale=scale)
    with pytest.raises(ValueError, match=r"k_scale: expected shape \(B=1, N=1, K=5\), got \(1, 1, 4\)"):
        kernel._tiles.decode(**args, k_scale=scale[..., :4].copy(), v_scale=scale)
    floats = {**args, "k": np.ones((1, 1, 5, 8), np.float32), "v": np.ones((1, 1, 5, 8), np.float32), "dtype": "float32"}
    with pytest.raises(ValueError, match="k_scale: expected None for a float cache"):
        kernel._tiles.decode(**floats, k_scale=scale, v_scale=scale)
    kernel._tiles.decode(**args, k_scale=scale, v_scale=scale)
    assert np.allclose(args["out"], 1.0)


@pytest.mark.needs("torch")
@pytest.mark.parametrize("b, h, hkv, tq, tk, d", [(2, 8, 2, 1, 1000, 64), (1, 4, 4, 3, 77, 16), (1, 6, 2, 2, 333, 20)])
def test_a_float8_cache_gives_the_reference_on_its_dequantized_values(isa, b, h, hkv, tq, tk, d):
    """One scale per sequence and k/v head (the quantized cache's "fp8"); every one of the 254 codes that are not
    NaN is read (keys and values), subnormal codes included."""
    import torch

    rng = np.random.default_rng(tk + d)
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    x = torch.from_numpy(rng.standard_normal((2, b, hkv, tk, d)).astype(np.float32))
    bits = torch.arange(256, dtype=torch.int32)
    every = bits[(bits & 0x7F) != 0x7F].to(torch.uint8).view(torch.float8_e4m3fn)  # 254 codes
    scale = (x.abs().amax((-1, -2)) / 448).float()
    codes = (x / scale[..., None, None]).to(torch.float8_e4m3fn)
    flat = codes.view(2, -1)
    flat[:, : every.numel()] = every  # the first keys of the first head hold every code
    deq = codes.double() * scale[..., None, None].double()
    lengths = np.array([tk, tk // 2 + 1][:b])
    out, _ = kernel.decode(q, codes[0], codes[1], lengths, scale=0.125, causal=True, k_scale=scale[0], v_scale=scale[1])
    np.testing.assert_allclose(out, _want(q, deq[0].numpy(), deq[1].numpy(), lengths), atol=2e-5)
    float32, _ = kernel.decode(q, deq[0].float(), deq[1].float(), lengths, scale=0.125, causal=True)
    np.testing.assert_allclose(out, float32, atol=1e-5)  # the float32 pass's rounding, no more


def _int4(rng, b, hkv, tk, d, held, slots=64, residual="float32"):
    """Keys and values of an int4 cache (:class:`QuantizedKV`, KIVI's layout) holding random codes, scales, zero
    points and residual rings, C > Tk slots (the pass reads a prefix): positions >= held[b] come from the rings."""
    import torch

    from attnlab.reference.quantized import QuantizedKV

    c = -(-tk // 32) * 32 + 32
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))  # noqa: E731
    codes = [torch.from_numpy(rng.integers(0, 256, (b, hkv, c, d // 2), dtype=np.uint8)) for _ in "kv"]
    rings = [t(rng.standard_normal((b, hkv, slots, d))).to(getattr(torch, residual)) for _ in "kv"]
    held = torch.tensor(held, dtype=torch.long)
    k = QuantizedKV("int4", codes[0], t(rng.uniform(0.05, 0.2, (b, hkv, c // 32, d))), tk, d, 99.0,
                    t(rng.uniform(-1.5, 0.0, (b, hkv, c // 32, d))), rings[0], held, "channel")
    v = QuantizedKV("int4", codes[1], t(rng.uniform(0.05, 0.2, (b, hkv, c, d // 32))), tk, d, 99.0,
                    t(rng.uniform(-1.5, 0.0, (b, hkv, c, d // 32))), rings[1], held.clone(), "token")
    return k, v


@pytest.mark.needs("torch")
@pytest.mark.parametrize("b, h, hkv, tq, tk, d, held, window, residual", [
    (2, 8, 2, 1, 1000, 64, [928, 480], None, "float32"),  # GQA, ragged lengths, the second's newest 21 in the ring
    (1, 4, 4, 3, 77, 32, [64], None, "float32"),  # three rows, a partial last block of the ring
    (1, 6, 2, 2, 333, 32, [288], 50, "bfloat16"),  # a window (from inside a group), a bfloat16 residual
    (2, 12, 4, 5, 130, 64, [0, 96], None, "float16"),  # five rows of three heads: rows in fours; a ring alone
    (1, 32, 8, 1, 2100, 128, [1984], None, "float32"),  # the decode benchmark's heads
])
def test_an_int4_cache_gives_the_reference_on_its_dequantized_values(isa, b, h, hkv, tq, tk, d, held, window, residual):
    """Codes, each group's scale and zero point, and the float residual read in one pass, against the float64
    reference on QuantizedKV.dequantize (the definition): every code 0..15 in both nibbles, ragged lengths."""
    rng = np.random.default_rng(tk + d)
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    k, v = _int4(rng, b, hkv, tk, d, held, residual=residual)
    lengths = np.array([tk, tk // 2 + 1][:b])
    out, lse = kernel.decode(q, k, v, lengths, scale=0.125, causal=True, window=None if window is None else (window, 0))
    want = _want(q, k.reference(), v.reference(), lengths, window)
    np.testing.assert_allclose(out, want, atol=2e-5 * np.abs(want).max())
    assert np.isfinite(lse).all()


@pytest.mark.needs("torch")
@pytest.mark.parametrize("tq, rows", [(1, [0]), (3, [2, 0])])
def test_rows_of_weights_of_an_int4_cache_come_from_the_pass(isa, tq, rows):
    """attention(weights_rows=) over a quantized cache is the kernel's (no longer blockwise's): the rows' weights
    from the scores its decode pass wrote and its LSE, against the float64 reference on the dequantized cache."""
    import torch

    from attnlab import attention

    rng = np.random.default_rng(11)
    b, h, hkv, tk, d = 2, 8, 2, 300, 32
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    k, v = _int4(rng, b, hkv, tk, d, [256, 128], residual="float32")
    lengths = np.array([tk, tk // 2 + 1])
    out, w = attention(torch.from_numpy(q), k, v, backend="kernel", scale=0.125, causal=True,
                       lengths=torch.from_numpy(lengths), weights_rows=rows)
    pos = (lengths - tq)[:, None, None] + np.arange(tq)[None, :, None]
    j = np.arange(tk)[None, None, :]
    allowed = ((j < lengths[:, None, None]) & (j <= pos))[:, None]
    g = h // hkv
    want_out, want = reference.attention(q.astype(np.float64), np.repeat(k.reference(), g, 1), np.repeat(v.reference(), g, 1),
                                         mask=allowed, scale=0.125, return_weights=True)
    assert w.shape == (b, h, len(rows), tk) and w.dtype == torch.float32
    np.testing.assert_allclose(w.numpy(), want[:, :, rows], atol=2e-6)
    np.testing.assert_allclose(w.numpy().sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(out.numpy(), want_out, atol=2e-5 * np.abs(want_out).max())


@pytest.mark.needs("torch")
def test_int4_codes_with_sinks_and_the_stored_layout_checked():
    import torch

    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    k, v = _int4(rng, 1, 2, 200, 32, [160])
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    out, _ = kernel.decode(q, k, v, scale=0.2, sinks=sinks)
    kk, vv = np.repeat(k.reference(), 2, 1), np.repeat(v.reference(), 2, 1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) * 0.2
    e = np.exp(s - s.max(-1, keepdims=True))
    total = e.sum(-1, keepdims=True) + np.exp(sinks.astype(np.float64)[None, :, None, None] - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, np.einsum("bhqk,bhkd->bhqd", e / total, vv), atol=2e-5)
    args = dict(q=q, k=k.codes[:, :, :200].numpy(), v=v.codes[:, :, :200].numpy(), out=np.empty((1, 4, 1, 32), np.float32),
                lse=np.empty((1, 4, 1), np.float32), dtype="int4", scale=1.0, threads=0, k_scale=k.scale.numpy(),
                v_scale=v.scale.numpy(), k_zero=k.zero.numpy(), v_zero=v.zero.numpy(), k_residual=k.residual.numpy(),
                v_residual=v.residual.numpy(), k_quantized=np.array([160]), v_quantized=np.array([160]))
    kernel._tiles.decode(**args)
    with pytest.raises(ValueError, match="k_quantized: expected positions held as codes >= 0 and a multiple of 32, got 100"):
        kernel._tiles.decode(**{**args, "k_quantized": np.array([100])})
    with pytest.raises(ValueError, match="v_residual: expected a ring of a multiple of 32 slots"):
        kernel._tiles.decode(**{**args, "v_residual": args["v_residual"][:, :, :40].copy()})
    with pytest.raises(ValueError, match=r"k_scale: expected at least 7 groups of 32 keys \(dim 2\), got 6"):
        kernel._tiles.decode(**{**args, "k_scale": args["k_scale"][:, :, :6].copy(), "k_zero": args["k_zero"][:, :, :6].copy()})
    with pytest.raises(ValueError, match="v_zero: expected an array with int4 codes, got None"):
        kernel._tiles.decode(**{**args, "v_zero": None})
    with pytest.raises(ValueError, match="k_zero: expected None unless dtype is 'int4'"):
        kernel._tiles.decode(**{**args, "dtype": "int8", "k": args["k"].view(np.int8), "v": args["v"].view(np.int8)})
    narrow = {**args, "q": q[..., :16].copy(), "k": args["k"][..., :8].copy()}
    with pytest.raises(ValueError, match="k: expected int4 codes two per byte of a head width divisible by 32"):
        kernel._tiles.decode(**narrow)
    with pytest.raises(ValueError, match="k and v: the kernel reads int4 keys grouped per channel and values per token"):
        kernel.decode(q, v, k, scale=1.0)
    assert torch.equal(k.quantized, torch.tensor([160]))  # nothing written back


# int4 keys' scores on AMX (_tiles_decode_amx.h): the same results as the vector registers' way within float32
# rounding; each test with AMX on (where this CPU and kernel allow it) and off.
AMX_HERE = bool(kernel.build_info()["amx_here"])


@pytest.fixture(params=[True, False] if AMX_HERE else [False], ids=lambda on: "amx" if on else "vectors")
def amx(request):
    was = kernel._tiles.amx()
    kernel._tiles.amx(request.param)
    yield request.param
    kernel._tiles.amx(was)


def _allowed(b, tq, tk, lengths, window=None, sinks=0):
    pos = (lengths - tq)[:, None, None] + np.arange(tq)[None, :, None]
    j = np.arange(tk)[None, None, :]
    near = (j >= pos - window) if window is not None else True
    return ((j < lengths[:, None, None]) & (j <= pos) & (near | (j < sinks)))[:, None]


def _reference(q, k, v, allowed, scale):
    g = q.shape[1] // k.shape[1]
    return reference.attention(q.astype(np.float64), np.repeat(k.reference(), g, 1), np.repeat(v.reference(), g, 1),
                               mask=allowed, scale=scale)


@pytest.mark.needs("torch")
@pytest.mark.parametrize("b, h, hkv, tq, tk, d, held, window, sinks", [
    (2, 8, 2, 1, 1000, 64, [928, 480], None, 0),  # GQA, ragged lengths, rings
    (1, 32, 8, 1, 2100, 128, [1984], None, 0),  # the decode benchmark's heads
    (1, 8, 2, 2, 700, 128, [672], 90, 0),  # a window starting inside a group: its first block unread
    (1, 8, 2, 1, 900, 128, [864], 100, 4),  # sink tokens and a window: blocks between them unread
    (1, 18, 2, 1, 333, 64, [320], None, 0),  # 9 rows: row groups of 4, 4 and 1
    (1, 4, 1, 3, 200, 256, [192], None, 0),  # D = 256: two tiles of codes a key
    (1, 4, 2, 1, 130, 96, [128], None, 0),  # D = 96: never AMX (the vector way)
])
def test_int4_scores_on_amx_match_the_reference(amx, b, h, hkv, tq, tk, d, held, window, sinks):
    rng = np.random.default_rng(tk + d + sinks)
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    k, v = _int4(rng, b, hkv, tk, d, held)
    lengths = np.array([tk, tk // 2 + 1][:b])
    mask = masks.cache_lengths(lengths) & masks.causal()
    if window is not None:
        mask = mask & (masks.window(window) | masks.sink_tokens(sinks)) if sinks else mask & masks.window(window)
    out, lse = kernel.decode(q, k, v, scale=0.125, mask=mask)
    want = _reference(q, k, v, _allowed(b, tq, tk, lengths, window, sinks), 0.125)
    np.testing.assert_allclose(out, want, atol=2e-5 * np.abs(want).max())
    assert np.isfinite(lse).all()


@pytest.mark.needs("torch")
def test_amx_and_vectors_agree_where_the_query_spans_many_octaves():
    """A query whose channels span 2^-20 .. 2^12 (and scales 2^-6 .. 2^3): each row's integers keep its largest
    products' every bit, so AMX and the float32 sums agree to float32 rounding of the scores."""
    import torch

    if not AMX_HERE:
        pytest.skip("no AMX on this CPU or kernel")
    rng = np.random.default_rng(7)
    q = (rng.standard_normal((1, 8, 1, 128)) * 2.0 ** rng.integers(-20, 12, 128)).astype(np.float32) * 1e-3
    k, v = _int4(rng, 1, 2, 4096, 128, [4064])
    k.scale.mul_(torch.from_numpy(2.0 ** rng.integers(-6, 3, (1, 1, 1, 128))).float())
    outs = {}
    for on in (True, False):
        kernel._tiles.amx(on)
        outs[on], _ = kernel.decode(q, k, v, scale=0.125)
    kernel._tiles.amx(True)
    want = _reference(q, k, v, None, 0.125)
    for on in (True, False):
        np.testing.assert_allclose(outs[on], want, atol=2e-5 * np.abs(want).max())
    np.testing.assert_allclose(outs[True], outs[False], atol=1e-5 * np.abs(want).max())


@pytest.mark.needs("torch")
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_key_scale_that_is_not_finite_is_still_caught(amx, bad):
    """A group whose scaled query is not finite goes the vector way, whose scores show it to the pass's check."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 8, 1, 128)).astype(np.float32)
    k, v = _int4(rng, 1, 2, 640, 128, [608])
    kernel.decode(q, k, v, scale=0.125, check=True)
    k.scale[0, 1, 9, 77] = bad
    with pytest.raises(Unchecked):
        kernel.decode(q, k, v, scale=0.125, check=True)


def test_amx_is_turned_on_and_off_where_it_exists():
    was = kernel._tiles.amx()
    assert was is AMX_HERE  # on by default where it exists
    assert kernel._tiles.amx(None) is was  # None asks, as no argument does
    assert kernel._tiles.amx(False) is False
    if AMX_HERE:
        assert kernel._tiles.amx(True) is True
    else:
        with pytest.raises(ValueError, match="amx: this CPU, kernel or build has no AMX tiles"):
            kernel._tiles.amx(True)
    kernel._tiles.amx(was)
    info = kernel.build_info()
    assert info["amx"] is was and info["amx_here"] is AMX_HERE


def test_linux_lends_the_tiles_only_when_int4_decoding_first_needs_them():
    """Importing attnlab, or decoding a float cache, does not ask Linux for AMX (a process holding the tiles' permission
    needs larger signal stacks); the first question (or int4 decoding) does."""
    import subprocess
    import sys

    if not AMX_HERE:
        pytest.skip("no AMX on this CPU or kernel")
    code = ("import ctypes, numpy as np\n"
            "from attnlab.backends import kernel\n"
            "def lent():\n"
            "    v = ctypes.c_ulong(0); ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(v)); return v.value >> 18 & 1\n"
            "x = np.ones((1, 2, 1, 64), np.float32); kernel.decode(x, x, x, scale=1.0)\n"
            "print(lent(), kernel._tiles.amx(), lent())\n")  # 158: arch_prctl, 0x1022: ARCH_GET_XCOMP_PERM, bit 18: tiles
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["0", "True", "1"]


@pytest.mark.needs("torch")
def test_a_last_group_whose_codes_end_early_is_read_only_as_far_as_they_go(amx):
    """Codes held up to 64 positions but an array of 50 rows (a call's keys end inside the group): AMX reads a group's
    32 rows whole, so that group goes the vector way, which reads the 50 rows only."""
    from attnlab.reference.quantized import QuantizedKV

    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    k, v = _int4(rng, 1, 2, 50, 64, [64])
    short = lambda x: QuantizedKV(x.kind, x.codes[:, :, :50].clone(), x.scale, 50, 64, x.norm, x.zero,  # noqa: E731
                                  x.residual, x.quantized, x.grouping)
    k, v = short(k), short(v)
    out, _ = kernel.decode(q, k, v, scale=0.125)
    want = _reference(q, k, v, None, 0.125)
    np.testing.assert_allclose(out, want, atol=2e-5 * np.abs(want).max())
