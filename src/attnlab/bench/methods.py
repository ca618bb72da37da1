"""The methods a benchmark compares, and a zero-argument call computing each on given inputs.

=================  ==================================================================================
naive              the textbook NumPy listing, softmax(Q Kᵀ / √d) V on whole arrays: one sequence, no mask
numpy              the float64 NumPy reference, the specification (NumPy arrays in)
torch              PyTorch eager (tensors in)
sdpa               ``torch.nn.functional.scaled_dot_product_attention`` (tensors in)
blockwise-numpy    attnlab's online softmax as a Python loop of NumPy calls (NumPy arrays in)
blockwise-torch    the same loop of torch calls (tensors in)
kernel             the same online softmax compiled (C, OpenMP, SIMD; tensors in)
auto               what ``attnlab.attention`` chooses for tensors (:func:`auto_choice` says which and why)
gemm               the attention's two GEMMs alone, as torch calls on the loop's tiles, without the
                   softmax: what two library GEMMs of these shapes reach, the ceiling for the arithmetic
=================  ==================================================================================

Inputs are float32, (heads, n, d), batch 1; the methods on tensors share the NumPy arrays' memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from attnlab.backends import kernel, tiling
from attnlab.backends.api import attention
from attnlab.backends.dispatch import Choice, explain, refusals
from attnlab.backends.options import Options
from attnlab.backends.request import prepare
from attnlab.reference import attention as reference
from attnlab.reference.masks import band_mask

METHODS = ("naive", "numpy", "torch", "sdpa", "blockwise-numpy", "blockwise-torch", "kernel", "auto", "gemm")
NUMPY_METHODS = ("naive", "numpy", "blockwise-numpy")  # the rest run on torch tensors
BACKEND = {  # the attnlab backend each method names ("auto" lets the dispatcher choose)
    "numpy": "numpy", "torch": "torch", "sdpa": "sdpa", "blockwise-numpy": "blockwise",
    "blockwise-torch": "blockwise", "kernel": "kernel", "auto": "auto",
}
ERROR_ROWS = 64  # the error is measured on this many query rows, spread over n


def method_of(backend: str) -> str:
    """The method that runs ``backend`` on tensors (what auto's choice is compared with)."""
    return {"blockwise": "blockwise-torch"}.get(backend, backend)


def library(method: str) -> str:
    """The library a method's call runs on: "numpy" or "torch"."""
    return "numpy" if method in NUMPY_METHODS else "torch"


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def flops(n: int, d: int, heads: int, causal: bool) -> float:
    """Floating-point operations of attention: the two GEMMs, 2·n²·d each per head; half for causal."""
    return 4.0 * n * n * d * heads * (0.5 if causal else 1.0)


def naive_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The textbook listing of attention in NumPy, line for line: one sequence, no mask, every score
    and weight materialised (the baseline that the tiled methods are measured against)."""

    def softmax(x):  # noqa: ANN001, ANN202
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    d = K.shape[-1]
    scores = Q @ K.T
    if scale:
        scores = scores / np.sqrt(d)
    weights = softmax(scores)
    return weights @ V, weights


def inputs(n: int, d: int, heads: int, seed: int, dtype: str = "float32") -> dict[str, Any]:
    """Seeded q, k, v of shape (heads, n, d): ``{"np": (q, k, v)}``; the tensors are added when first needed."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((heads, n, d), dtype=np.dtype(dtype)) for _ in range(3))
    return {"np": (q, k, v)}


def _tensors(data: dict[str, Any]) -> tuple[Any, Any, Any]:
    import torch

    if "torch" not in data:
        data["torch"] = tuple(torch.from_numpy(x) for x in data["np"])
    return data["torch"]


def estimate_bytes(method: str, n: int, d: int, heads: int) -> float:
    """Extra memory a method needs, roughly, to decide what to skip before trying it."""
    check_method(method)
    nn = float(n) * n * heads
    lin = 6.0 * n * d * heads * 4  # float32 copies of q, k, v (with their extra column), the output
    bq, bk = tiling.block_sizes(heads, n)
    tile = min(bq * bk * heads, nn) * 4  # the loop's float32 score tile
    small = min(kernel.BLOCK[0] * kernel.BLOCK[1], nn) * 4 * (os.cpu_count() or 1)  # the kernel's score tile per thread
    return {
        "naive": nn * 4 * 3, "numpy": nn * 8 * 4, "torch": nn * 4 * 3, "sdpa": lin,
        "blockwise-numpy": lin + tile, "blockwise-torch": lin + tile, "kernel": lin + small,
        "auto": lin + max(tile, small), "gemm": lin + tile,
    }[method]


def _request(q: Any, k: Any, v: Any, causal: bool) -> Any:
    return prepare(q, k, v, Options(causal=causal)).request


def auto_choice(data: dict[str, Any], causal: bool) -> Choice:
    """auto's choice for these inputs as tensors, with its reason.

    It is what ``attention(..., backend="auto")`` would run; where auto measures the backends on
    this machine (:mod:`attnlab.backends.calibrate`), asking measures them first if they are not
    cached, so the caller should ask before timing anything.
    """
    return explain(_request(*_tensors(data), causal))


def runner(method: str, data: dict[str, Any], causal: bool) -> tuple[Callable[[], Any], str | None]:
    """A zero-argument call computing ``method`` on the inputs, and why it cannot run (None: it can)."""
    check_method(method)
    q, k, v = data["np"]
    if method == "naive":
        if causal:
            return (lambda: None), "the naive listing has no mask"
        return (lambda: np.stack([naive_attention(q[h], k[h], v[h])[0] for h in range(q.shape[0])])), None
    if method in NUMPY_METHODS:
        args = (q, k, v)
    else:
        args = _tensors(data)
    if method == "gemm":
        return _gemm(*args), None
    name = BACKEND[method]
    if name != "auto":
        why = refusals(_request(*args, causal))[name]
        if why:
            return (lambda: None), f"{name} refuses: {'; '.join(why)}"
    return (lambda: attention(*args, causal=causal, backend=name)), None


def _gemm(tq: Any, tk: Any, tv: Any) -> Callable[[], Any]:
    import torch

    def gemm() -> Any:  # the attention's two GEMMs on the loop's tiles, without the softmax
        h, n = tq.shape[0], tq.shape[1]
        bq, bk = tiling.block_sizes(h, n)
        kt = tk.transpose(-1, -2)
        out = torch.zeros_like(tv)
        s = torch.empty(h, bq, bk)
        for i in range(0, n, bq):
            for j in range(0, n, bk):
                whole = i + bq <= n and j + bk <= n  # a ragged edge tile gets its own buffer
                tile = torch.matmul(tq[:, i : i + bq], kt[:, :, j : j + bk], out=s if whole else None)
                out[:, i : i + bq].baddbmm_(tile, tv[:, j : j + bk])
        return out

    return gemm


def error(out: Any, data: dict[str, Any], causal: bool) -> float:
    """The largest absolute difference of ``out`` from the float64 reference, on up to ERROR_ROWS query rows."""
    q, k, v = data["np"]
    n = q.shape[1]
    rows = np.unique(np.linspace(0, n - 1, min(n, ERROR_ROWS)).astype(int))
    mask = band_mask(n, n, right=0, rows=rows) if causal else None  # those rows only: n² would not fit at 65 536
    exact = reference.attention(q[:, rows].astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask=mask)
    got = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    return float(np.abs(got[:, rows].astype(np.float64) - exact).max())


_WARM: set[tuple[str, int, bool]] = set()


def warm_up(methods: tuple[str, ...], d: int, causal: bool) -> None:
    """One small untimed call per method: library start-up (torch import, BLAS set-up) is not its cost."""
    data = inputs(256, d, 1, 0)
    for m in methods:
        if (m, d, causal) not in _WARM:
            fn, why = runner(m, data, causal)
            if why is None:
                fn()
            _WARM.add((m, d, causal))
