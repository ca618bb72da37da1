"""Every backend against the float64 reference, on the same cases (DESIGN.md: the reference is the spec)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from attnlab.spec import reference
from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS, NoBackendError, choose
from attnlab.spec.masks import causal_mask, window_mask

torch = pytest.importorskip("torch")


def _case(name, hq=2, hkv=None, tq=97, tk=None, d=59, dv=None, b=2, **kw):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    tk, dv, hkv = tk or tq, dv or d, hkv or hq
    q = rng.standard_normal((b, hq, tq, d))
    k = rng.standard_normal((b, hkv, tk, d))
    v = rng.standard_normal((b, hkv, tk, dv))
    return pytest.param(q, k, v, kw, id=name)


def _expected(q, k, v, kw):
    """The reference on repeated heads and a dense mask built from the foundation's mask functions."""
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    tq, tk = q.shape[-2], k.shape[-2]
    allowed = np.ones((tq, tk), bool)
    if kw.get("causal"):
        allowed &= causal_mask(tq, tk)
    if "window" in kw:
        left, right = kw["window"] if isinstance(kw["window"], tuple) else (kw["window"],) * 2
        allowed = allowed & window_mask(tq, tk, left=left, right=right)
    if "lengths" in kw:
        allowed = allowed & (np.arange(tk) < np.asarray(kw["lengths"])[:, None, None, None])
    if kw.get("mask") is not None:
        allowed = allowed & kw["mask"]
    return reference.attention(q, k, v, mask=allowed, bias=kw.get("bias"), scale=kw.get("scale")), allowed


RNG = np.random.default_rng(7)
CASES = [
    _case("odd-97-d59"),
    _case("n1025-causal", hq=1, b=1, tq=1025, d=64, causal=True),
    _case("tq<tk-dv-causal-bottom-right", tq=33, tk=97, d=16, dv=24, causal=True),
    _case("tq>tk-causal-empty-rows", tq=40, tk=25, d=8, causal=True),
    _case("mask-and-bias", tq=31, tk=45, d=12, mask=RNG.random((31, 45)) > 0.3, bias=RNG.standard_normal((2, 31, 45))),
    _case("fully-masked-row", tq=20, d=8, mask=np.tile(np.arange(20)[:, None] != 5, (1, 20))),
    _case("padding-lengths", tq=50, d=16, lengths=[0, 37]),
    _case("gqa-causal", hq=6, hkv=2, tq=41, d=16, causal=True),
    _case("window", tq=70, d=16, window=(5, 2)),
    _case("causal-window", tq=70, d=16, window=8, causal=True),
    _case("scale", tq=20, d=8, scale=1.0),
]


def _run(backend, kind, q, k, v, kw, **extra):
    kw = dict(kw)
    if kind == "torch":
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
        kw = {n: torch.from_numpy(x) if isinstance(x, np.ndarray) and n in ("mask", "bias") else x for n, x in kw.items()}
    res = attention(q, k, v, backend=backend, **kw, **extra)
    return res


def _np(x):
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("q, k, v, kw", CASES)
def test_every_backend_matches_the_reference(backend, kind, q, k, v, kw):
    if backend == "numpy" and kind == "torch":
        pytest.skip("the numpy backend takes NumPy arrays (refusal tested below)")
    # tiles that divide neither length; n = 1025 keeps the default tiles (512 does not divide it either)
    extra = {"block_size": (16, 23)} if backend == "blockwise" and q.shape[-2] < 500 else {}
    out = _run(backend, kind, q, k, v, kw, **extra)
    assert type(out).__module__.startswith(kind)
    expected, _ = _expected(q, k, v, kw)
    np.testing.assert_allclose(_np(out), expected, atol=1e-10)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("q, k, v, kw", [CASES[3], CASES[4], CASES[6], CASES[7], CASES[9]])
def test_weights_rows_and_lse_equal_the_reference(kind, q, k, v, kw):
    expected, allowed = _expected(q, k, v, kw)
    g = q.shape[-3] // k.shape[-3]
    _, weights = reference.attention(q, np.repeat(k, g, -3), np.repeat(v, g, -3), mask=allowed, bias=kw.get("bias"), return_weights=True)
    s = reference.scores(q, np.repeat(k, g, -3), scale=kw.get("scale")) + (kw["bias"] if "bias" in kw else 0)
    lse = reference.logsumexp(np.where(allowed, s, -np.inf))
    rows = [0, 3, q.shape[-2] - 1]
    for backend in ("blockwise", "torch"):
        out, w, l = _run(backend, kind, q, k, v, kw, weights_rows=rows, return_lse=True)
        np.testing.assert_allclose(_np(out), expected, atol=1e-10)
        np.testing.assert_allclose(_np(w), weights[..., rows, :], atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(_np(l)), np.isneginf(lse))
        np.testing.assert_allclose(np.nan_to_num(_np(l), neginf=0), np.nan_to_num(lse, neginf=0), atol=1e-10)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_result_keeps_kind_and_dtype(backend):
    q = np.random.default_rng(0).standard_normal((2, 9, 8)).astype(np.float32)
    if backend != "numpy":
        t = torch.from_numpy(q)
        out = attention(t, t, t, backend=backend)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device == t.device
    out = attention(q, q, q, backend=backend)  # NumPy in, NumPy out, whatever computes it
    assert isinstance(out, np.ndarray) and out.dtype == np.float32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["sdpa", "blockwise"])
def test_low_precision_error_is_at_most_twice_plain_torch(backend, dtype):
    rng = np.random.default_rng(3)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, 200, 64))).to(getattr(torch, dtype)) for _ in range(3))
    exact = reference.attention(*(x.double().numpy() for x in (q, k, v)), causal=True)

    def err(name):
        out = attention(q, k, v, causal=True, backend=name)
        assert out.dtype == getattr(torch, dtype)
        return np.abs(out.double().numpy() - exact).max()

    assert err(backend) <= 2 * err("torch")


def test_auto_picks_a_backend_that_serves_the_call_and_matches():
    q, k, v, kw = CASES[7].values
    out, w = attention(q, k, v, weights_rows=[2], **kw)
    expected, _ = _expected(q, k, v, kw)
    np.testing.assert_allclose(out, expected, atol=1e-10)
    from attnlab.backends.request import prepare

    call = prepare(q, k, v, mask=None, bias=None, causal=False, scale=None, window=None, lengths=None,
                   return_weights=True, weights_rows=None, return_lse=False, block_size=None)
    assert choose(call.request).name in ("numpy", "torch")  # only materialising backends give every weight


def test_named_backend_never_falls_back_and_lists_every_reason():
    t = torch.zeros(1, 4, 8)
    with pytest.raises(NoBackendError) as e:
        attention(t, t, t, backend="sdpa", return_weights=True)
    msg = str(e.value)
    assert "backend 'sdpa' cannot serve this call: fused kernels return no attention weights" in msg
    for name in BACKENDS:
        assert f"\n  {name}: " in msg
    assert "numpy: takes NumPy arrays, got torch tensors" in msg


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"backend": "flash"}, ValueError, "backend must be 'auto' or one of numpy, torch, sdpa, blockwise, got 'flash'"),
        ({"window": -1}, ValueError, "window must be an int >= 0"),
        ({"lengths": [[3]]}, ValueError, "lengths must have the shape of the leading batch dims (2, 4)"),
        ({"lengths": [3, 99]}, ValueError, "lengths must lie in 0..Tk=6"),
        ({"weights_rows": [5]}, ValueError, "weights_rows must be query indices in 0..Tq-1=4, got [5]"),
        ({"weights_rows": [1], "return_weights": True}, ValueError, "not both"),
        ({"block_size": 0, "backend": "blockwise"}, ValueError, "block_size must be an int >= 1"),
        ({"block_size": 8, "backend": "sdpa"}, NoBackendError, "has no block size"),
        ({"causal": "yes"}, TypeError, "causal must be True or False, got 'yes'"),
    ],
)
def test_errors_name_the_argument(kwargs, error, text):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 4, 6, 8))
    with pytest.raises(error) as e:
        attention(q, k, k, **kwargs)
    assert text in str(e.value)


def test_grouped_query_heads_must_divide():
    q, k = np.zeros((1, 6, 3, 4)), np.zeros((1, 4, 3, 4))
    with pytest.raises(ValueError, match=r"key/value heads to divide the query heads \(dim -3\): q has 6"):
        attention(q, k, k)


def test_mask_of_another_kind_is_refused():
    t = torch.zeros(1, 4, 8)
    with pytest.raises(TypeError, match="mask must be of the same kind as q"):
        attention(t, t, t, mask=np.ones((4, 4), bool))


@pytest.mark.parametrize("shape", [(9, 8), (3, 9, 8), (2, 3, 4, 9, 8)], ids=["2-D", "3-D", "5-D"])
@pytest.mark.parametrize("backend", ["torch", "sdpa", "blockwise"])
def test_any_number_of_leading_dims(backend, shape):
    """SDPA's fused kernels want 4-D input; the backends take (..., T, D) with any leading dims."""
    x = np.random.default_rng(1).standard_normal(shape)
    mask = np.random.default_rng(2).random(shape[:-1] + (9,)) > 0.3  # per-batch masks, rows may be empty
    out = attention(torch.from_numpy(x), torch.from_numpy(x), torch.from_numpy(x), mask=torch.from_numpy(mask), backend=backend)
    assert tuple(out.shape) == shape
    np.testing.assert_allclose(out.numpy(), reference.attention(x, x, x, mask=mask), atol=1e-10)
