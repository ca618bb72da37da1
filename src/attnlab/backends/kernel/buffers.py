"""How arrays reach the compiled kernel as buffers, without a copy where they can: float32 inputs, a cache's
k and v as stored (16-bit values as their bits), and a quantized cache (:class:`QuantizedKV`) as its codes,
scales and, for int4, zero points, residual rings and positions held as codes (``_tiles.decode``'s arguments),
and the visibility keywords every compiled pass takes (:func:`vis_args`); and the rows of weights the decode
pass's written scores give (:func:`rows_weights`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.backends.tiling import LOG2E
from attnlab.backends.visible import Visible
from attnlab.reference.quantized import QuantizedKV
from attnlab.reference.validate import dtype_name, is_torch


def buffers(*xs: Any) -> list[np.ndarray]:
    """C-contiguous float32 NumPy arrays (of torch tensors: views of the same memory where they can be)."""
    return [np.ascontiguousarray(x.detach().float().contiguous().numpy() if is_torch(x) else x, dtype=np.float32) for x in xs]


def stored(x: Any) -> Any:
    """k or v as the kernel reads it, no copy: NumPy, its bfloat16 values as their 16 bits."""
    if is_torch(x):
        import torch

        x = x.detach()
        bits = {"bfloat16": torch.int16, "float8_e4m3fn": torch.uint8}.get(dtype_name(x))
        return x.view(bits).numpy() if bits is not None else x.numpy()
    return x.view(np.int16) if dtype_name(x) == "bfloat16" else x


def scales(x: Any) -> np.ndarray:
    """A quantized cache's float32 scales as the kernel reads them: in place where each head's are contiguous
    (a slice [:, :, :T] of the cache's), a float32 copy otherwise."""
    if is_torch(x) and dtype_name(x) == "float32" and (x.shape[-1] <= 1 or x.stride(-1) == 1):
        return x.detach().numpy()
    return buffers(x)[0]


def quantized(k: QuantizedKV, v: QuantizedKV) -> tuple[Any, Any, dict[str, Any]]:
    """(k codes, v codes, keywords) of ``_tiles.decode`` for a quantized cache's first ``length`` keys and values,
    every tensor read where it lies: the codes [:, :, :Tk] (as they are: :func:`stored` takes them); int8's per-key scales [:, :, :Tk], fp8's per head; int4's
    scales and zero points whole (per group or per row), its residual rings (in the model's dtype) and held
    positions (keys grouped per channel, values per token: the layout every int4 cache writes)."""
    if k.kind != v.kind:
        raise ValueError(f"k and v must be quantized alike, got {k.kind} keys and {v.kind} values")
    n = k.length
    kw: dict[str, Any] = {"k_scale": scales(k.scale[:, :, :n] if k.kind == "int8" else k.scale),
                          "v_scale": scales(v.scale[:, :, :n] if v.kind == "int8" else v.scale)}
    if k.kind == "int4":
        if (k.grouping, v.grouping) != ("channel", "token"):
            raise ValueError(f"k and v: the kernel reads int4 keys grouped per channel and values per token, got "
                             f"{k.grouping!r} and {v.grouping!r}")
        kw.update(k_zero=scales(k.zero), v_zero=scales(v.zero), k_residual=stored(k.residual),
                  v_residual=stored(v.residual), k_quantized=_held(k.quantized), v_quantized=_held(v.quantized),
                  residual_dtype=dtype_name(k.residual))
    return k.codes[:, :, :n], v.codes[:, :, :n], kw


def _held(x: Any) -> np.ndarray:
    return np.ascontiguousarray(x.detach().cpu().numpy() if is_torch(x) else x, dtype=np.int64)


def vis_args(v: Visible | None, sinks: Any) -> dict[str, Any]:
    """The compiled passes' visibility keywords: each row's key intervals as stored (spans, two per row),
    ALiBi's query positions and base-2 slopes, the sink logits, all in the masks' (B, H) space."""
    if v is None:
        return {} if sinks is None else {"sinks": f32(sinks).reshape(-1, 1), "heads": 1}
    heads = v.frame.bh[1]
    kw: dict[str, Any] = {"heads": heads}
    if v.spans is not None:
        lo, hi = v.spans
        if lo.shape[-1] < 2:  # the kernel reads two intervals per row: the second empty
            lo, hi = (np.concatenate([x, np.zeros_like(x)], -1) for x in (lo, hi))
        kw["spans"] = np.ascontiguousarray(np.stack([lo, hi], -1).reshape(*lo.shape[:-1], 4), dtype=np.int64)
    if v.score_mod is not None:  # Alibi: the backend refuses any other
        kw["qpos"] = np.ascontiguousarray(v.frame.positions(), dtype=np.int64)
        kw["slopes"] = np.ascontiguousarray(v.score_mod.per_head(v.frame)[0] * LOG2E, dtype=np.float32)
    if sinks is not None:
        kw["sinks"] = f32(sinks).reshape(-1, heads)
    if v.softcap is not None:
        kw["softcap"] = v.softcap
    return kw


def f32(x: Any) -> np.ndarray:
    """x as a C-contiguous float32 NumPy array (a copy where it is not one already)."""
    return np.ascontiguousarray(x.detach().float().cpu().numpy() if is_torch(x) else x, dtype=np.float32)


def rows_weights(scores: np.ndarray, lse: np.ndarray, rows: Any, torch_out: bool = False) -> Any:
    """Query ``rows``' weights (B, H, R, Tk) float32 from the scores ``_tiles.decode`` wrote (base 2, −inf where a
    row sees no key) and its LSE (B, H, Tq): exp2(s − LSE log2 e), 0 throughout for a row that saw no key. NumPy,
    or a torch tensor on the same memory."""
    rows = np.asarray(rows)
    lse2 = lse[:, :, rows] * LOG2E  # (B, H, R)
    s = scores[:, :, rows]  # a copy
    s -= np.where(np.isfinite(lse2), lse2, 0.0)[..., None]
    np.exp2(s, out=s)
    if torch_out:
        import torch

        return torch.from_numpy(s)
    return s
