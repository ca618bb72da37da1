"""The compiled decode pass over int8 and float8_e4m3fn caches (``kernel.decode(..., k_scale=, v_scale=)``): codes
read as stored and dequantized in registers (code · the key's or value row's scale; float8: the head's), against
the float64 reference on the dequantized keys and values. Every test runs once per instruction-set variant this
CPU runs."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.backends import kernel
from attnlab.reference import attention as reference

if kernel.isa() is None:
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)


@pytest.fixture(params=kernel._tiles.isas())
def isa(request):
    best = kernel._tiles.isa()
    kernel._tiles.isa(request.param)
    yield request.param
    kernel._tiles.isa(best)


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
