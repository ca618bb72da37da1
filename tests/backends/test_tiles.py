"""The compiled kernel (``_tiles.c``, backend="kernel") against the float64 reference and the Python loop.

It serves float32 CPU calls; the float64 cases of test_backends.py run other backends, so the
compiled kernel gets its own cases here: odd sizes, head dims that are not whole vectors, tiles
that divide nothing, bands, padding, GQA, empty rows, huge scores. Every test runs once per
instruction-set variant compiled in that this CPU runs (AVX-512, AVX2, 128-bit vectors), and the
arguments the C code is given are checked there, before it reads anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from attnlab.backends import agreement, kernel, online
from attnlab.backends.api import attention
from attnlab.backends.dispatch import NoBackendError
from attnlab import masks
from attnlab.backends.tiling import Tiling
from attnlab.backends.visible import describe
from attnlab.reference import attention as reference
from attnlab.reference.masks import causal_mask, window_mask

if kernel.isa() is None:
    if os.environ.get("CI"):  # CI builds it: a missing kernel there is a broken set-up, not a skip
        pytest.fail("attnlab.backends.kernel._tiles was not built (see pyproject.toml's ext-modules)", pytrace=False)
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)

ISAS = kernel._tiles.isas()


def pytest_generate_tests(metafunc):
    if "isa" in metafunc.fixturenames:
        metafunc.parametrize("isa", ISAS, indirect=True)


@pytest.fixture
def isa(request):
    """A test that takes ``isa`` runs once per instruction set compiled in that this CPU runs (AVX-512, AVX2, 128-bit)."""
    best = kernel._tiles.isa()
    assert kernel._tiles.isa(request.param) == request.param
    yield request.param
    kernel._tiles.isa(best)


def _data(name, b=2, hq=2, hkv=None, tq=97, tk=None, d=59, dv=None, spread=1.0):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    hkv, tk, dv = hkv or hq, tk or tq, dv or d
    q = (rng.standard_normal((b, hq, tq, d)) * spread).astype(np.float32)
    k = rng.standard_normal((b, hkv, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, tk, dv)).astype(np.float32)
    return q, k, v


def _allowed(tq, tk, causal=False, window=None, lengths=None):
    """(Tq, Tk), or (B, 1, Tq, Tk) with lengths (B,): with causal each sequence's queries end at its length."""
    allowed = np.ones((tq, tk), bool)
    ends = np.asarray(lengths)[:, None] if causal and lengths is not None else None  # (B, 1)
    if causal:
        allowed = allowed & causal_mask(tq, tk, lengths=ends)
    if window is not None:
        left, right = window if isinstance(window, tuple) else (window, window)
        allowed = allowed & window_mask(tq, tk, left=left, right=right, lengths=ends)
    if lengths is not None:
        allowed = allowed & (np.arange(tk) < np.asarray(lengths)[:, None, None, None])
    return allowed


def _expected(q, k, v, causal=False, window=None, lengths=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    allowed = _allowed(q.shape[-2], k.shape[-2], causal, window, lengths)
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
def test_compiled_kernel_matches_the_float64_reference(case, block, isa):
    (q, k, v), kw = case
    out, lse = attention(q, k, v, backend="kernel", return_lse=True, block_size=block, **kw)
    expected, expected_lse = _expected(q, k, v, **kw)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=2e-6)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    np.testing.assert_allclose(np.nan_to_num(lse, neginf=0), np.nan_to_num(expected_lse, neginf=0), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.needs("torch")
def test_compiled_kernel_and_python_loop_agree_on_tensors(case, isa):
    import torch

    (q, k, v), kw = case
    q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    out, lse = attention(q, k, v, backend="kernel", return_lse=True, **kw)
    loop, loop_lse = attention(q, k, v, backend="blockwise", return_lse=True, **kw)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, loop, atol=2e-6, rtol=0)
    torch.testing.assert_close(lse, loop_lse, atol=1e-5, rtol=1e-6)


def test_the_wrapper_is_the_loops_twin(isa):
    """kernel.forward and online.forward take the same canonical arguments and give the same results."""
    q, k, v = _data("twin", b=1, hq=3, tq=70, d=24)
    q, k, v = q[0][None], k[0, 0][None], v[0, 0][None]  # (B, G, Tq, D), (B, Tk, D), (B, Tk, Dv)
    tiling = Tiling(70, 70, describe(masks.causal() & masks.key_lengths(np.array([[60, 70, 0]])), 70, 70, (1, 3)))
    out, lse = kernel.forward(q, k, v, tiling, scale=0.2, block_size=(16, 32), threads=2)
    loop_out, loop_lse = online.forward(q, k, v, tiling, scale=0.2, block_size=(16, 32))
    np.testing.assert_allclose(out, loop_out, atol=2e-6)
    np.testing.assert_allclose(lse, loop_lse, atol=1e-5)
    assert np.isneginf(lse[0, 2]).all() and (out[0, 2] == 0).all()


def test_result_does_not_depend_on_the_thread_count(isa):
    q, k, v = _data("threads", b=3, hq=4, tq=257, d=64)
    q, k, v = q, k[:, 0], v[:, 0]
    q = q.reshape(3, 4, 257, 64)  # four query heads on one key/value head
    tiling = Tiling.of(257, 257, masks.causal())
    one = kernel.forward(q, k, v, tiling, scale=0.125, threads=1)
    three = kernel.forward(q, k, v, tiling, scale=0.125, threads=3)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)  # a query block is always one thread's: bit for bit


def test_huge_scores_neither_overflow_nor_lose_the_maximum(isa):
    q, k, v = _data("huge", tq=200, d=32, spread=3e3)  # scores up to ~1e5: exp of anything but the max is 0
    out = attention(q, k, v, backend="kernel")
    expected, _ = _expected(q, k, v)
    assert np.isfinite(out).all()
    # float32 rounds a score of 1e5 by ~0.004, which moves the weights: judge against plain float32 math
    s = q @ np.swapaxes(k, -1, -2) / np.float32(np.sqrt(32))
    e = np.exp(s - s.max(-1, keepdims=True))
    plain = (e / e.sum(-1, keepdims=True)) @ v
    assert np.abs(out - expected).max() <= 2 * np.abs(plain - expected).max() + 1e-6


def test_exp2_polynomial_is_accurate_and_exactly_zero_for_hidden_scores(isa):
    # one query against keys with scores 0, -1/4, ..., down to -175 (base 2), and a hidden tail
    d, n = 1, 700
    q = np.ones((1, 1, 1, d), np.float32)
    k = (-np.arange(n, dtype=np.float32) / 4).reshape(1, 1, n, d) / np.float32(np.log2(np.e))
    v = np.eye(n, dtype=np.float32).reshape(1, 1, n, n)
    out = attention(q, k, v, backend="kernel", scale=1.0, lengths=[650])  # out[j] is weight j
    w = out[0, 0, 0]
    exact = 2.0 ** (-np.arange(650) / 4) / np.sum(2.0 ** (-np.arange(650) / 4))
    np.testing.assert_allclose(w[:650], exact, rtol=3e-6, atol=1e-30)
    assert (w[650:] == 0).all() and (w[:650] > 0).sum() >= 4 * 126  # below 2^-126 float32 flushes to 0


def test_what_it_refuses_it_says_and_the_loop_serves():
    q, k, v = _data("refuse", tq=20, d=8)
    with pytest.raises(NoBackendError, match="backend 'kernel' cannot serve this call: .*float64"):
        attention(q.astype(np.float64), k, v, backend="kernel")
    with pytest.raises(NoBackendError, match="backend 'kernel' cannot serve this call: .*mask"):
        attention(q, k, v, backend="kernel", mask=np.tril(np.ones((20, 20), bool)))
    out = attention(q, k, v, backend="blockwise", mask=np.tril(np.ones((20, 20), bool)))
    np.testing.assert_allclose(out, _expected(q, k, v, causal=True)[0], atol=2e-6)


def _args(**change):
    """forward's arguments for a small valid call, with some replaced."""
    q = np.zeros((1, 2, 4, 8), np.float32)
    args = {"q": q, "k": np.zeros((1, 5, 8), np.float32), "v": np.zeros((1, 5, 3), np.float32),
            "out": np.empty((1, 2, 4, 3), np.float32), "lse": np.empty((1, 2, 4), np.float32),
            "spans": np.array([[[[0, 5, 0, 0]] * 4, [[0, 0, 0, 0]] * 4]], np.int64), "heads": 2, "scale": 1.0,
            "block_q": 4, "block_k": 4, "threads": 1}
    args.update(change)
    return args


def test_a_valid_direct_call_runs(isa):
    args = _args(q=np.ones((1, 2, 4, 8), np.float32), v=np.ones((1, 5, 3), np.float32))
    kernel._tiles.forward(**args)
    assert (args["out"][0, 0] == 1).all() and (args["out"][0, 1] == 0).all() and np.isneginf(args["lse"][0, 1]).all()


@pytest.mark.parametrize("change, text", [
    ({"k": np.zeros(40, np.float32)}, "k: expected shape (B=1, K, D=8), got (40,)"),
    ({"k": np.zeros((1, 5, 7), np.float32)}, "k: expected shape (B=1, K, D=8), got (1, 5, 7)"),
    ({"v": np.zeros((1, 6, 3), np.float32)}, "v: expected shape (B=1, K=5, V), got (1, 6, 3)"),
    ({"out": np.empty((1, 2, 4, 4), np.float32)}, "out: expected shape (B=1, G=2, T=4, V=3), got (1, 2, 4, 4)"),
    ({"lse": np.empty((2, 4), np.float32)}, "lse: expected shape (B=1, G=2, T=4), got (2, 4)"),
    ({"spans": np.zeros((2, 4, 4), np.int64)}, "spans: expected shape (B, H, T, S), got (2, 4, 4)"),
    ({"q": np.zeros((1, 2, 4, 8))}, "q: expected float32 items (buffer format 'f'), got format 'd' of 8 bytes"),
    ({"spans": np.zeros((1, 2, 4, 4), np.int32)}, "spans: expected int64 items"),
    ({"q": np.zeros((1, 2, 8, 4), np.float32).swapaxes(-1, -2)}, "q: expected a C-contiguous array"),
    ({"out": np.empty((1, 2, 4, 3), np.float32)[..., ::-1]}, "out: expected a C-contiguous array"),
    ({"q": [[1.0]]}, "q: expected a float32 array, got list"),
    ({"spans": np.array([[[[0, 6, 0, 0]] * 4] * 2], np.int64)}, "spans: expected sorted, separate key intervals inside 0..Tk=5"),
    ({"spans": np.array([[[[-1, 5, 0, 0]] * 4] * 2], np.int64)}, "spans: expected sorted, separate key intervals"),
    ({"spans": np.zeros((1, 2, 3, 4), np.int64)}, "spans: expected dim 2 of size 4, got 3"),
    ({"heads": 3}, "heads: expected a divisor >= 1 of the 2 heads, got 3"),
    ({"slopes": np.zeros(2, np.float32)}, "qpos: expected each query's position with slopes (ALiBi), got None"),
    ({"block_q": 0}, "block_q: expected a block size >= 1, got 0"),
    ({"block_k": -3}, "block_k: expected a block size >= 1, got -3"),
    ({"threads": -1}, "threads: expected >= 0"),
    ({"q": np.zeros((1, 2, 4, 0), np.float32), "k": np.zeros((1, 5, 0), np.float32)}, "q: expected a head dim >= 1"),
])
def test_bad_arguments_raise_naming_them_instead_of_reading_past_them(change, text):
    args = _args(**change)
    with pytest.raises(ValueError) as e:
        kernel._tiles.forward(**args)
    assert text in str(e.value)


def test_a_read_only_output_is_refused():
    out = np.empty((1, 2, 4, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: expected a writable float32 array"):
        kernel._tiles.forward(**_args(out=out))


def test_huge_block_sizes_and_band_edges_are_clamped_not_overflowed(isa):
    big = 2**62
    args = _args(q=np.ones((1, 2, 4, 8), np.float32), v=np.ones((1, 5, 3), np.float32), block_q=big, block_k=big)
    kernel._tiles.forward(**args)
    assert (args["out"][0, 0] == 1).all()


def test_an_instruction_set_this_cpu_lacks_is_refused():
    with pytest.raises(ValueError, match="this CPU or build has no 'SVE'"):
        kernel._tiles.isa("SVE")


def test_build_info_says_what_was_compiled_and_what_runs(isa):
    info = kernel.build_info()
    names = [v["name"] for v in info["variants"]]
    assert info["chosen"] == isa == kernel.isa()
    assert [v["name"] for v in info["variants"] if v["runs_here"]] == ISAS
    assert names[-1] == "128-bit vectors" and info["variants"][-1]["target"] == ""
    assert info["compiler"].split()[0] in ("gcc", "clang")
    if re.match(r"x86_64|AMD64", os.uname().machine):
        assert names[:2] == ["AVX-512", "AVX2"]
        assert "avx512f" in info["variants"][0]["target"] and "avx2" in info["variants"][1]["target"]


def _disassembly():
    tool = shutil.which("objdump")
    if tool is None:
        pytest.skip("objdump is not installed (binutils)")
    text = subprocess.run([tool, "-d", "--no-show-raw-insn", kernel._tiles.__file__], capture_output=True, text=True,
                          check=True).stdout
    functions: dict[str, str] = {}
    for part in re.split(r"\n(?=[0-9a-f]+ <[^>]+>:\n)", text):
        head = re.match(r"[0-9a-f]+ <([^>]+)>:", part)
        if head:
            functions[head.group(1)] = part
    return functions


@pytest.mark.parametrize("variant, register, wider", [("avx512", "zmm", None), ("avx2", "ymm", "zmm")])
def test_each_variant_is_compiled_with_vectors_of_its_width(variant, register, wider):
    compiled = {v["name"] for v in kernel.build_info()["variants"]}
    if {"avx512": "AVX-512", "avx2": "AVX2"}[variant] not in compiled:
        pytest.skip(f"{variant} was not compiled in on this platform")
    functions = _disassembly()
    for name in ("item", "btile", "shead", "ditem"):  # forward's work item, backward's tile, statistics' head, decode's chunk
        code = functions.get(f"{name}_{variant}")
        assert code is not None, f"no {name}_{variant} symbol in the extension (stripped?): {sorted(functions)[:20]}"
        assert len(re.findall(rf"%{register}\d+", code)) > 20, f"{name}_{variant} uses no {register} registers"
        if wider:
            assert not re.search(rf"%{wider}\d+", code), f"{name}_{variant} uses {wider} registers"
        assert not re.search(r"%[yz]mm\d+", functions[f"{name}_base"]), f"{name}_base uses AVX registers"


@pytest.mark.needs("torch")
def test_torch_set_num_threads_reaches_the_kernel():
    import torch

    before = torch.get_num_threads()
    try:
        # torch sets OpenMP's default in the one libgomp the process has; the kernel (threads=None) takes it
        torch.set_num_threads(1)
        assert kernel._tiles.default_threads() == 1
        torch.set_num_threads(2)
        assert kernel._tiles.default_threads() == 2
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- the compiled backward pass

def _kernel_serves(kw):
    """The case's description is one the kernel reads (key intervals, ALiBi, sinks): no array, bias or callable."""
    mask, mod = kw.get("mask"), kw.get("score_mod")
    return ("bias" not in kw and (mask is None or isinstance(mask, masks.Mask) and mask.structured)
            and (mod is None or isinstance(mod, masks.ScoreMod) and mod.structured))


BACKWARD_CASES = [c for c in agreement.CASES if _kernel_serves(c.kwargs)]
# The precision claim against plain torch is for training shapes. On the decode cases the compiled
# gradients stay within float32's relative 1e-7 .. 1e-6 of float64, as the Python loop's do (the other
# backward test holds them to it), but plain autograd is near exact where a row sees one key (6x apart).
TRAINING_CASES = [c for c in BACKWARD_CASES if c not in agreement.DECODE_CASES]


@pytest.mark.needs("torch")
def _grads(backend, q, k, v, dout, dlse, kw, dtype):
    """dq, dk, dv (float64 NumPy) of sum(out * dout) + sum(lse * dlse) through ``backend`` in ``dtype``."""
    import torch

    leaves = [torch.from_numpy(x).to(dtype).requires_grad_() for x in (q, k, v)]
    kw = {n: (torch.from_numpy(x) if x.dtype == bool else torch.from_numpy(x).to(dtype)) if isinstance(x, np.ndarray)
          and n in ("mask", "sink_logits") else x for n, x in kw.items()}
    out, lse = attention(*leaves, backend=backend, return_lse=True, **kw)
    assert out.dtype == dtype
    hidden = torch.isneginf(lse)  # no gradient flows back through the -inf of an empty row
    loss = (out * torch.from_numpy(dout).to(dtype)).sum() + torch.where(hidden, 0, lse * torch.from_numpy(dlse).to(dtype)).sum()
    loss.backward()
    return [x.grad.double().numpy() for x in leaves]


def _rounded_case(case):
    """The case's q, k, v rounded to float32 (so float64 runs see the very inputs of the float32 ones), dout, dlse."""
    q, k, v = (x.astype(np.float32).astype(np.float64) for x in agreement.data(case))
    rng = np.random.default_rng(zlib.crc32(b"dout" + case.name.encode()))
    dout = rng.standard_normal(q.shape[:-1] + (v.shape[-1],)).astype(np.float32).astype(np.float64)
    dlse = rng.standard_normal(q.shape[:-1]).astype(np.float32).astype(np.float64)
    return q, k, v, dout, dlse


@pytest.mark.parametrize("case", TRAINING_CASES, ids=[c.name for c in TRAINING_CASES])
@pytest.mark.needs("torch")
def test_compiled_gradients_within_twice_plain_torch_float32(case, isa):
    """Against float64 autograd through the reference's math: at most 2x the error of plain torch float32 autograd.

    The error of a gradient is the norm of its difference from float64's (over the whole tensor).
    The largest single difference is noisier (one element): it is held to 5x plain torch's, a guard
    against a wrong tile rather than a precision claim (measured: up to 3.3x, as the Python loop's;
    both use a float32 LSE and D = rowsum(dO o), where plain autograd differentiates softmax itself).
    """
    import torch

    q, k, v, dout, dlse = _rounded_case(case)
    kw = case.kwargs
    exact = _grads("torch", q, k, v, dout, dlse, kw, torch.float64)
    plain = _grads("torch", q, k, v, dout, dlse, kw, torch.float32)
    compiled = _grads("kernel", q, k, v, dout, dlse, kw, torch.float32)
    for name, e, p, c in zip(("dq", "dk", "dv"), exact, plain, compiled):
        err, yardstick = np.linalg.norm(c - e), np.linalg.norm(p - e)
        assert err <= 2 * yardstick, f"{name}: |error| {err:.3g} vs plain torch float32's {yardstick:.3g}"
        worst, plain_worst = np.abs(c - e).max(), np.abs(p - e).max()
        assert worst <= 5 * plain_worst, f"{name}: largest error {worst:.3g} vs plain torch float32's {plain_worst:.3g}"


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=[c.name for c in BACKWARD_CASES])
@pytest.mark.needs("torch")
def test_compiled_and_python_backward_agree_and_empty_rows_get_zero_gradients(case, isa):
    import torch

    q, k, v, dout, dlse = _rounded_case(case)
    kw = case.kwargs
    compiled = _grads("kernel", q, k, v, dout, dlse, kw, torch.float32)
    loop = _grads("blockwise", q, k, v, dout, dlse, kw, torch.float32)
    for c, p in zip(compiled, loop):
        np.testing.assert_allclose(c, p, atol=2e-5 * max(1.0, np.abs(p).max()))
    g = q.shape[1] // k.shape[1]
    allowed = np.broadcast_to(agreement.allowed_of(q.shape[2], k.shape[2], causal=kw.get("causal", False),
                                                   window=kw.get("window"), lengths=kw.get("lengths"), mask=kw.get("mask"),
                                                   batch_dims=2), q.shape[:2] + (q.shape[2], k.shape[2]))
    seen = allowed.any(-1)  # (B, Hq, Tq): rows that attend to something
    assert (compiled[0][~seen] == 0).all()  # rows with nothing to attend to: exactly zero dq
    unseen_keys = ~allowed.reshape(q.shape[0], k.shape[1], g, q.shape[2], k.shape[2]).any((2, 3))  # (B, Hkv, Tk)
    assert (compiled[1][unseen_keys] == 0).all() and (compiled[2][unseen_keys] == 0).all()


@pytest.mark.needs("torch")
def test_backward_passes_gradcheck_in_float64_through_the_python_path():
    """The float64 twin of the compiled backward (the blockwise loop, which the kernel matches above) passes gradcheck."""
    import torch

    g = torch.Generator().manual_seed(5)
    for kw in ({"causal": True}, {"window": (2, 1), "lengths": np.array([7])}, {"causal": True, "window": 3}):
        q = torch.randn(1, 4, 6, 3, generator=g, dtype=torch.float64, requires_grad=True)  # Tq = 6 < Tk = 8, GQA 4 / 2
        k = torch.randn(1, 2, 8, 3, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(1, 2, 8, 2, generator=g, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda q, k, v: attention(q, k, v, backend="blockwise", block_size=(4, 3), return_lse=True, **kw), (q, k, v))


def _backward_inputs(name, b, g, tq, tk, d, dv, tiling, scale=0.3):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q = rng.standard_normal((b, g, tq, d)).astype(np.float32)
    k = rng.standard_normal((b, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, tk, dv)).astype(np.float32)
    out, lse = kernel.forward(q, k, v, tiling, scale=scale)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    dlse = rng.standard_normal(lse.shape).astype(np.float32)
    return q, k, v, out, lse, dout, dlse


@pytest.mark.parametrize("block", [None, (16, 23), (7, 100), (1000, 5)], ids=["default", "16x23", "7x100", "1000x5"])
@pytest.mark.parametrize("b, g", [(1, 1), (3, 2)], ids=["one-head", "three-heads-gqa2"])
def test_backward_is_the_same_bits_for_any_thread_count(b, g, block, isa):
    """threads=1 runs the heads schedule, more threads than heads the split one: the same sums in the same order."""
    lengths = np.array([[170, 100]] * b)[:, :g]
    tiling = Tiling(150, 170, describe(masks.window(60, 0) & masks.key_lengths(lengths), 150, 170, (b, g)))
    args = _backward_inputs("threads-bwd", b, g, 150, 170, 24, 20, tiling)
    one = kernel.backward(*args, tiling, scale=0.3, block_size=block, threads=1)
    loop = online.backward(*args, tiling, scale=0.3, block_size=block)
    for x, y in zip(one, loop):
        np.testing.assert_allclose(x, y, atol=5e-6)
    for threads in (2, 5):
        for x, y in zip(one, kernel.backward(*args, tiling, scale=0.3, block_size=block, threads=threads)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.needs("torch")
def test_the_kernel_backend_differentiates_with_the_compiled_backward(monkeypatch):
    import torch

    def refuse(*a, **kw):
        raise AssertionError("the Python backward ran")

    monkeypatch.setattr(online, "backward", refuse)
    q, k, v = (torch.randn(1, 2, 30, 8, requires_grad=True) for _ in range(3))
    attention(q, k, v, backend="kernel", causal=True).sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    with pytest.raises(AssertionError, match="the Python backward ran"):  # the patch does reach the loop's path
        attention(q, k, v, backend="blockwise", causal=True).sum().backward()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.needs("torch")
def test_low_precision_gradients_are_computed_in_float32(dtype, isa):
    import torch

    case = agreement.case("grouped-query causal")
    q, k, v, dout, dlse = _rounded_case(case)
    low = getattr(torch, dtype)
    q, k, v, dout, dlse = (torch.from_numpy(x).to(low).double().numpy() for x in (q, k, v, dout, dlse))  # exact in `low`
    exact = _grads("torch", q, k, v, dout, dlse, case.kwargs, torch.float64)
    plain = _grads("torch", q, k, v, dout, dlse, case.kwargs, low)
    compiled = _grads("kernel", q, k, v, dout, dlse, case.kwargs, low)
    for e, p, c in zip(exact, plain, compiled):
        assert np.linalg.norm(c - e) <= 2 * np.linalg.norm(p - e)


def _bargs(**change):
    """backward's arguments for a small valid call, with some replaced."""
    f = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    args = {"q": f(1, 2, 4, 8), "k": f(1, 5, 8), "v": f(1, 5, 3), "out": f(1, 2, 4, 3), "lse": f(1, 2, 4),
            "dout": f(1, 2, 4, 3), "dlse": None, "dq": f(1, 2, 4, 8), "dk": f(1, 5, 8), "dv": f(1, 5, 3),
            "scale": 1.0, "block_q": 4, "block_k": 4, "threads": 1}
    args.update(change)
    return args


@pytest.mark.parametrize("change, text", [
    ({"dout": np.zeros((1, 2, 4, 8), np.float32)}, "dout: expected shape (B=1, G=2, T=4, V=3), got (1, 2, 4, 8)"),
    ({"dlse": np.zeros((1, 2, 5), np.float32)}, "dlse: expected shape (B=1, G=2, T=4), got (1, 2, 5)"),
    ({"dk": np.zeros((1, 5, 8))}, "dk: expected float32 items"),
    ({"spans": np.array([[[[0, 6, 0, 0]] * 4] * 2], np.int64), "heads": 2}, "spans: expected sorted, separate key intervals inside 0..Tk=5"),
    ({"block_k": 0}, "block_k: expected a block size >= 1, got 0"),
    ({"threads": -2}, "threads: expected >= 0"),
])
def test_bad_backward_arguments_raise_naming_them(change, text):
    with pytest.raises(ValueError) as e:
        kernel._tiles.backward(**_bargs(**change))
    assert text in str(e.value)


def test_backward_outputs_may_not_overlap_its_inputs():
    q = np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(ValueError, match="dq: expected an array of its own, got one that overlaps q"):
        kernel._tiles.backward(**_bargs(q=q, dq=q))


def test_backward_with_no_queries_gives_zero_key_gradients(isa):
    f = lambda *s: np.full(s, 7, np.float32)  # noqa: E731
    args = _bargs(q=f(1, 2, 0, 8), out=f(1, 2, 0, 3), lse=f(1, 2, 0), dout=f(1, 2, 0, 3), dq=f(1, 2, 0, 8), dk=f(1, 5, 8),
                  dv=f(1, 5, 3))
    kernel._tiles.backward(**args)
    assert (args["dk"] == 0).all() and (args["dv"] == 0).all()


# The statistics pass (head_stats): kernel.stats against the same statistics in float64 NumPy, from
# dense weights exp(scale q·k − LSE) with the very LSE it is given.

def _dense_stats(q, k, lse, scale, seen):
    """(sums (B, G, 7), received (B, G, T)) by definition, in float64, from dense [T, T] weights."""
    b, g, t, _ = q.shape
    s = np.einsum("bgid,bjd->bgij", q.astype(np.float64), k.astype(np.float64)) * scale
    w = np.where(seen, np.exp(s - lse.astype(np.float64)[..., None]), 0.0)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    ent = -(w * np.where(seen, s - lse[..., None], 0.0)).sum(-1)  # (B, G, T)
    n = seen.sum(-1)
    rows = {
        "prev": np.diagonal(w, -1, -2, -1).sum(-1), "self": np.diagonal(w, 0, -2, -1).sum(-1),
        "next": np.diagonal(w, 1, -2, -1).sum(-1), "first": w[..., 0].sum(-1),
        "distance": (w * np.abs(i - j)).sum((-1, -2)), "entropy": ent.sum(-1),
        "entropy_norm": (ent[..., n > 1] / np.log(n[n > 1])).sum(-1),
    }
    return np.stack([rows[name] for name in kernel.STATS], -1), w.sum(-2)


def _stats_mask(left, right, sinks=0):
    """The description of a stats case: a window (None, None: every key), with ``sinks`` first keys beside it."""
    m = None if left is None and right is None else masks.window(left, right)
    return m if not sinks else (m | masks.sink_tokens(sinks)) & masks.causal()


STATS_CASES = {
    "full-odd": dict(b=1, g=3, t=97, d=59, left=None, right=None),
    "sink-tokens-and-window": dict(b=1, g=2, t=300, d=16, left=20, right=0, sinks=3),
    "causal-gqa": dict(b=2, g=3, t=300, d=32, left=None, right=0),
    "window": dict(b=1, g=2, t=257, d=16, left=37, right=5),
    "causal-window": dict(b=1, g=1, t=200, d=64, left=20, right=0),
    "one-token": dict(b=1, g=2, t=1, d=8, left=None, right=0),
}


@pytest.mark.parametrize("block", [None, (16, 23), (1000, 5)], ids=["default", "16x23", "1000x5"])
@pytest.mark.parametrize("case", STATS_CASES.values(), ids=STATS_CASES.keys())
def test_compiled_statistics_match_float64_dense_weights(case, block, isa):
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    b, g, t, d, left, right = (case[x] for x in ("b", "g", "t", "d", "left", "right"))
    mask = _stats_mask(left, right, case.get("sinks", 0))
    q = (rng.standard_normal((b, g, t, d)) * 2).astype(np.float32)
    k = rng.standard_normal((b, t, d)).astype(np.float32)
    scale = d**-0.5
    allowed = np.ones((t, t), bool) if mask is None else mask.dense(t)[0, 0]
    s = np.einsum("bgid,bjd->bgij", q.astype(np.float64), k.astype(np.float64)) * scale
    lse = reference.logsumexp(np.where(allowed, s, -np.inf)).astype(np.float32)
    sums, received = kernel.stats(q, k, lse, scale=scale, mask=mask, block_size=block)
    want, want_received = _dense_stats(q, k, lse, scale, allowed)
    assert sums.dtype == received.dtype == np.float64
    np.testing.assert_allclose(sums, want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(received, want_received, rtol=2e-6, atol=1e-6)


def test_compiled_statistics_are_the_same_bits_for_any_thread_count(isa):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 333, 32)).astype(np.float32)
    k = rng.standard_normal((2, 333, 32)).astype(np.float32)
    lse = np.full((2, 3, 333), 6.0, np.float32)
    one = kernel.stats(q, k, lse, scale=0.2, mask=masks.causal(), threads=1)
    three = kernel.stats(q, k, lse, scale=0.2, mask=masks.causal(), threads=3)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)  # a head is always one thread's, its rows in order


def _stats_args(**change):
    """stats' arguments for a small valid call, with some replaced."""
    args = {"q": np.zeros((1, 2, 4, 8), np.float32), "k": np.zeros((1, 4, 8), np.float32),
            "lse": np.zeros((1, 2, 4), np.float32), "sums": np.empty((1, 2, 7)), "received": np.empty((1, 2, 4)),
            "scale": 1.0, "block_q": 4, "block_k": 4, "threads": 1}
    args.update(change)
    return args


@pytest.mark.parametrize("change, text", [
    ({"k": np.zeros((1, 5, 8), np.float32)}, "k: expected shape (B=1, T=4, D=8), got (1, 5, 8)"),
    ({"lse": np.zeros((1, 2, 5), np.float32)}, "lse: expected shape (B=1, G=2, T=4), got (1, 2, 5)"),
    ({"sums": np.empty((1, 2, 6))}, "sums: expected shape (B=1, G=2, S=7), got (1, 2, 6)"),
    ({"sums": np.empty((1, 2, 7), np.float32)}, "sums: expected float64 items (buffer format 'd')"),
    ({"received": np.empty((1, 2, 4))[..., ::-1]}, "received: expected a C-contiguous array"),
    ({"q": np.zeros((1, 2, 4, 8))}, "q: expected float32 items"),
    ({"block_k": 0}, "block_k: expected a block size >= 1, got 0"),
    ({"spans": np.zeros((1, 2, 3, 4), np.int64), "heads": 2}, "spans: expected dim 2 of size 4, got 3"),
])
def test_bad_statistics_arguments_raise_naming_them(change, text):
    with pytest.raises(ValueError) as e:
        kernel._tiles.stats(**_stats_args(**change))
    assert text in str(e.value)


def test_a_read_only_statistics_output_is_refused():
    sums = np.empty((1, 2, 7))
    sums.flags.writeable = False
    with pytest.raises(ValueError, match="sums: expected a writable float64 array"):
        kernel._tiles.stats(**_stats_args(sums=sums))


@pytest.mark.parametrize("name", ISAS)
def test_the_environment_picks_the_variant(name):
    """ATTNLAB_KERNEL_ISA runs another compiled variant (to measure a machine without the better one)."""
    code = "from attnlab.backends import kernel; print(kernel.isa())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, kernel.ENV_ISA: name},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == name


def test_an_unknown_variant_in_the_environment_warns_and_keeps_the_best():
    code = "from attnlab.backends import kernel; print(kernel.isa())"
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], env={**os.environ, kernel.ENV_ISA: "SSE9"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ISAS[0] and "ATTNLAB_KERNEL_ISA must name" in out.stderr and "'SSE9'" in out.stderr
