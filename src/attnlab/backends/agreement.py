"""``attnlab check``: every backend against the float64 reference, on this machine.

The test suite's cases, run where the user is (their torch build, their BLAS, their GPU if any):
each available backend, on NumPy arrays and torch tensors on every device, in float64 and float32,
and in float16/bfloat16 where the tolerance is relative (DESIGN.md): at most twice the error of
plain torch in that dtype. A backend that refuses a case says why; that is not a failure.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from attnlab.spec import reference
from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS, NoBackendError
from attnlab.spec.masks import causal_mask, window_mask

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}  # absolute, outputs of unit scale
LOW_PRECISION_FACTOR = 2.0  # float16/bfloat16: at most this times plain torch's error


@dataclass(frozen=True)
class Case:
    name: str
    q_shape: tuple  # (B, Hq, Tq, D)
    kv_heads: int
    tk: int
    dv: int
    kwargs: tuple = ()  # (name, value) pairs for attention(); NumPy values


def _cases() -> list[Case]:
    rng = np.random.default_rng(0)
    return [
        Case("n=97, D=59", (2, 2, 97, 59), 2, 97, 59),
        Case("n=1025 causal", (1, 1, 1025, 64), 1, 1025, 64, (("causal", True),)),
        Case("Tq<Tk causal, Dv≠D", (2, 2, 33, 16), 2, 97, 24, (("causal", True),)),
        Case("Tq>Tk causal (empty rows)", (1, 2, 40, 8), 2, 25, 8, (("causal", True),)),
        Case("mask and bias", (2, 2, 31, 12), 2, 45, 12,
             (("mask", rng.random((31, 45)) > 0.3), ("bias", rng.standard_normal((2, 31, 45))))),
        Case("padding lengths", (2, 2, 50, 16), 2, 50, 16, (("lengths", np.array([0, 37])),)),
        Case("grouped-query causal", (2, 6, 41, 16), 2, 41, 16, (("causal", True),)),
        Case("sliding window", (1, 2, 70, 16), 2, 70, 16, (("window", (8, 0)), ("causal", True))),
    ]


def _data(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    b, h, tq, d = case.q_shape
    return (rng.standard_normal((b, h, tq, d)), rng.standard_normal((b, case.kv_heads, case.tk, d)),
            rng.standard_normal((b, case.kv_heads, case.tk, case.dv)))


def _exact(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The reference, fed repeated heads and one dense mask built from the foundation's masks."""
    kw = dict(case.kwargs)
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    tq, tk = q.shape[-2], k.shape[-2]
    allowed = causal_mask(tq, tk) if kw.get("causal") else np.ones((tq, tk), bool)
    if "window" in kw:
        allowed = allowed & window_mask(tq, tk, left=kw["window"][0], right=kw["window"][1])
    if "lengths" in kw:
        allowed = allowed & (np.arange(tk) < kw["lengths"][:, None, None, None])
    if "mask" in kw:
        allowed = allowed & kw["mask"]
    return reference.attention(q, k, v, mask=allowed, bias=kw.get("bias"))


@dataclass(frozen=True)
class CheckRow:
    backend: str
    case: str
    kind: str  # "numpy" or "torch:<device>"
    dtype: str
    max_error: float | None
    tolerance: float | None
    passed: bool | None  # None: the backend refused the case
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _devices() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _convert(x: Any, kind: str, dtype: str) -> Any:
    if not isinstance(x, np.ndarray):
        return x
    if x.dtype == bool or np.issubdtype(x.dtype, np.integer):
        return x if kind == "numpy" or x.dtype != bool else _torch(x, kind, None)
    return x.astype(dtype) if kind == "numpy" else _torch(x, kind, dtype)


def _torch(x: np.ndarray, kind: str, dtype: str | None) -> Any:
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x)).to(kind.split(":", 1)[1])
    return t if dtype is None else t.to(getattr(torch, dtype))


def _run(backend: str, case: Case, qkv: tuple, kind: str, dtype: str) -> np.ndarray:
    args = [_convert(x, kind, dtype) for x in qkv]
    kw = {n: _convert(x, kind, dtype) for n, x in case.kwargs}
    out = attention(*args, backend=backend, **kw)
    if kind == "numpy":
        return np.asarray(out, dtype=np.float64)
    return out.detach().double().cpu().numpy()


def run_check(tick: Callable[[str], None] | None = None) -> list[CheckRow]:
    """Every (backend, case, kind, dtype): its max error against float64 and whether it passes."""
    kinds = ["numpy"] + [f"torch:{d}" for d in _devices()]
    rows: list[CheckRow] = []
    for case in _cases():
        qkv = _data(case)
        exact = _exact(case, *qkv)
        for kind in kinds:
            dtypes = ["float64", "float32"] + (["float16", "bfloat16"] if kind != "numpy" else [])
            for dtype in dtypes:
                low = dtype in ("float16", "bfloat16")
                if low:  # the exact answer for the rounded inputs, and plain torch's error on them
                    rounded = tuple(_torch(x, kind, dtype).double().cpu().numpy() for x in qkv)
                    exact_low = _exact(case, *rounded)
                    base = float(np.abs(_run("torch", case, rounded, kind, dtype) - exact_low).max())
                for name in BACKENDS:
                    if tick:
                        tick(name)
                    try:
                        got = _run(name, case, rounded if low else qkv, kind, dtype)
                    except NoBackendError as e:
                        rows.append(CheckRow(name, case.name, kind, dtype, None, None, None, str(e).split(": ", 1)[1].split("\n")[0]))
                        continue
                    err = float(np.abs(got - (exact_low if low else exact)).max())
                    tol = LOW_PRECISION_FACTOR * base if low else TOLERANCE[dtype]
                    note = f"plain torch's error {base:.2e}" if low else ""
                    rows.append(CheckRow(name, case.name, kind, dtype, err, tol, err <= tol, note))
    return rows
