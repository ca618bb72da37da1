"""Argument checks shared by every attention backend.

Each check raises a ``ValueError``/``TypeError`` whose message names the argument, what it got
and what was expected (docs/design.md, "Errors"). The checks look at shapes and dtypes only through
``.shape``/``.dtype``/``.ndim``, so they serve NumPy arrays and torch tensors alike; the value
checks (finite, mask dtype) have one path for each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


_DTYPE_NAMES: dict[Any, str] = {}  # each dtype's name, worked out once (every call asks for q's, k's and v's, often)


def dtype_name(x: Any) -> str:
    """'float32' for np.float32 and torch.float32 alike."""
    dtype = x.dtype
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
        return name
    except TypeError:  # an unhashable dtype (not NumPy's or torch's): named, for the error that refuses it
        return str(dtype).removeprefix("torch.")


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def broadcast_shapes(name_a: str, a: tuple, name_b: str, b: tuple) -> tuple:
    if a == b:
        return a
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise ValueError(
            f"{name_a} with leading shape {a} and {name_b} with leading shape {b} do not broadcast"
        ) from None


@dataclass(frozen=True)
class Problem:
    """The shape of one attention call, after the checks: what every backend needs to know."""

    batch: tuple  # broadcast leading dims of q, k, v (batch, heads, ...)
    tq: int
    tk: int
    d: int
    dv: int
    dtype: str  # the dtype of the result: q's (tensors), promoted from q, k, v (NumPy arrays)
    scale: float
    groups: int = 1  # query heads per key/value head (grouped-query attention; 1 = none)
    kv_dtype: str = ""  # the dtype k and v are stored in: a 16-bit cache under a float32 q, else dtype

    def __post_init__(self) -> None:
        if not self.kv_dtype:
            object.__setattr__(self, "kv_dtype", self.dtype)


def check_array(name: str, x: Any) -> None:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be a NumPy array or torch tensor, got {type(x).__name__}")
    if dtype_name(x) not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype ({', '.join(FLOAT_DTYPES)}), got {dtype_name(x)}"
        )
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., T, D) with at least 2 dims, got shape {tuple(x.shape)}")


def check_finite(name: str, x: Any) -> float:
    """Raise if ``x`` holds NaN or Inf; return its largest |value| (0 for an empty array).

    One pass of min and max, which NaN and Inf both reach, serves the check and the magnitude
    that overflow checks use.
    """
    if is_torch(x):
        import torch

        if x.numel() == 0:
            return 0.0
        lo, hi = (float(v) for v in torch.aminmax(x.detach()))  # one pass, on torch's threads (NumPy's is serial)
    else:
        if x.size == 0:
            return 0.0
        lo, hi = float(np.min(x)), float(np.max(x))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{name} contains NaN or Inf; attention needs finite inputs")
    return max(-lo, hi)


def check_scale(scale: Any, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a positive float or None (1/sqrt(D)), got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    return scale


def check_softcap(softcap: Any) -> float | None:
    """Logit softcapping: None (off) or a finite float > 0."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.floating, np.integer)):
        raise TypeError(f"softcap must be a positive float or None, got {type(softcap).__name__}")
    softcap = float(softcap)
    if not math.isfinite(softcap) or softcap <= 0:
        raise ValueError(f"softcap must be a finite number > 0, got {softcap}")
    return softcap


def head_groups(q: Any, k: Any, v: Any) -> int:
    """Query heads per key/value head: q (..., Hq, Tq, D), k/v (..., Hkv, Tk, ·) with Hkv | Hq.

    1 when k and v have as many heads as q (or broadcast over them the ordinary way, Hkv = 1).
    """
    if q.ndim < 3 or k.ndim < 3 or v.ndim < 3:
        return 1
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if hk != hv:
        raise ValueError(f"k and v must have the same number of heads (dim -3), got k shape {tuple(k.shape)} and v shape {tuple(v.shape)}")
    if hk in (hq, 1):
        return 1
    if hk > hq or hq % hk:
        raise ValueError(
            f"grouped-query attention needs the key/value heads to divide the query heads (dim -3): "
            f"q has {hq} (shape {tuple(q.shape)}), k has {hk} (shape {tuple(k.shape)})"
        )
    return hq // hk


def check_qkv(q: Any, k: Any, v: Any, scale: Any = None, *, finite: bool = True, gqa: bool = False) -> Problem:
    """Check q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv) and return the call's shape.

    With ``gqa=True`` k and v may have fewer heads (dim -3) than q, Hq = groups · Hkv; query head
    h then uses key/value head h // groups. The problem's ``batch`` is q's, heads included.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_array(name, x)
    kinds = {is_torch(x) for x in (q, k, v)}
    if len(kinds) > 1:
        raise TypeError("q, k and v must all be NumPy arrays or all torch tensors, got a mix")
    tq, d = q.shape[-2:]
    tk, dk = k.shape[-2:]
    tv, dv = v.shape[-2:]
    if dk != d:
        raise ValueError(f"k must have the same last dim D as q: q has D={d} (shape {tuple(q.shape)}), k has {dk} (shape {tuple(k.shape)})")
    if tv != tk:
        raise ValueError(f"v must have as many rows as k (Tk): k has Tk={tk} (shape {tuple(k.shape)}), v has {tv} (shape {tuple(v.shape)})")
    if tk == 0:
        raise ValueError(f"k and v must have at least one key (Tk >= 1), got Tk=0 (k shape {tuple(k.shape)})")
    if d == 0:
        raise ValueError(f"q and k must have D >= 1, got D=0 (q shape {tuple(q.shape)})")
    groups = head_groups(q, k, v) if gqa else 1
    k_lead, v_lead = tuple(k.shape[:-2]), tuple(v.shape[:-2])
    if groups > 1:  # a key/value head stands for `groups` query heads: compare as if repeated
        k_lead, v_lead = (*k_lead[:-1], k_lead[-1] * groups), (*v_lead[:-1], v_lead[-1] * groups)
    batch = broadcast_shapes("q", tuple(q.shape[:-2]), "k", k_lead)
    batch = broadcast_shapes("q/k", batch, "v", v_lead)
    if finite:
        for name, x in (("q", q), ("k", k), ("v", v)):
            check_finite(name, x)
    dtype, kv_dtype = _dtypes(q, k, v)
    return Problem(batch, int(tq), int(tk), int(d), int(dv), dtype, check_scale(scale, int(d)), groups, kv_dtype)


# A query may read keys and values stored narrower than itself: a 16-bit cache under a float32 query.
CACHE_DTYPES = {"float32": ("float16", "bfloat16")}


def _dtypes(q: Any, k: Any, v: Any) -> tuple[str, str]:
    """(the result's dtype, k and v's): tensors share one dtype, but for a float32 q over a float16 or
    bfloat16 k and v (the result is q's); NumPy arrays are promoted together, as NumPy does."""
    names = [dtype_name(x) for x in (q, k, v)]
    if not is_torch(q):
        dtype = str(np.result_type(*(np.dtype(t) for t in names)))
        return dtype, dtype
    if names[1] != names[2]:
        raise TypeError(f"k and v must share one dtype, got k {names[1]} and v {names[2]}")
    if names[0] != names[1] and names[1] not in CACHE_DTYPES.get(names[0], ()):
        raise TypeError(f"q, k and v must share one dtype, or q be float32 over float16 or bfloat16 k and v "
                        f"(a 16-bit cache), got q {names[0]} and k, v {names[1]}")
    return names[0], names[1]


def check_lengths(lengths: Any, p: Problem) -> np.ndarray:
    """Per-sequence key lengths (an int array or tensor shaped like a prefix of the batch dims, each in
    0..Tk), as an int64 NumPy array of that shape."""
    if is_torch(lengths):
        lengths = lengths.detach().cpu().numpy()
    arr = np.asarray(lengths)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"lengths must be integers (real keys per sequence), got dtype {arr.dtype}")
    if arr.ndim > len(p.batch) or tuple(arr.shape) != tuple(p.batch[: arr.ndim]):
        raise ValueError(
            f"lengths must have the shape of the leading batch dims {p.batch} or a prefix of it "
            f"(e.g. {p.batch[:1]}), got {tuple(arr.shape)}"
        )
    if arr.size and ((arr < 0) | (arr > p.tk)).any():
        raise ValueError(f"lengths must lie in 0..Tk={p.tk}, got values from {arr.min()} to {arr.max()}")
    return arr.astype(np.int64)


def check_mask(mask: Any, p: Problem) -> None:
    if mask is None:
        return
    if not hasattr(mask, "shape"):
        raise TypeError(f"mask must be a boolean array (True = may attend), got {type(mask).__name__}")
    if dtype_name(mask) != "bool":
        raise TypeError(
            f"mask must have dtype bool (True = may attend), got {dtype_name(mask)}; "
            "pass additive float scores as bias= instead"
        )
    _check_broadcast("mask", tuple(mask.shape), p)


def check_bias(bias: Any, p: Problem) -> None:
    if bias is None:
        return
    if not hasattr(bias, "shape"):
        raise TypeError(f"bias must be a float array added to the scores, got {type(bias).__name__}")
    if dtype_name(bias) not in FLOAT_DTYPES:
        raise TypeError(f"bias must be a float array added to the scores, got dtype {dtype_name(bias)}")
    _check_broadcast("bias", tuple(bias.shape), p)
    if is_torch(bias):
        import torch

        bad = bool(torch.isnan(bias).any() or torch.isposinf(bias).any())
    else:
        bad = bool(np.isnan(bias).any() or np.isposinf(bias).any())
    if bad:
        raise ValueError("bias contains NaN or +Inf; only finite values and -inf (a blocked pair) are allowed")


def _check_broadcast(name: str, shape: tuple, p: Problem) -> None:
    target = (*p.batch, p.tq, p.tk)
    try:
        full = np.broadcast_shapes(shape, target)
    except ValueError:
        full = None
    if full != target:
        raise ValueError(f"{name} of shape {shape} does not broadcast to the scores' shape (..., Tq, Tk) = {target}")
