"""A quantized cache's keys and values in an attention call (:class:`~attnlab.reference.quantized.QuantizedKV`).

:func:`stand_ins` lets :func:`~attnlab.backends.request.prepare` check the call's shapes on zero-stride views
of q's library and dtype (no memory), and :class:`Tiles` is what the blockwise loop reads in place of a
canonical k or v (B·H_kv, Tk, D): each slice it takes is dequantized then, one key block at a time, so no
full-size float copy of the cache is ever made. A reader of rotated keys turns its queries once (:func:`rotated_q`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.reference import validate
from attnlab.reference.quantized import QuantizedKV, hadamard


def stand_ins(q: Any, k: Any, v: Any) -> tuple[Any, Any] | None:
    """Zero-stride views shaped like a QuantizedKV ``k`` and ``v`` in q's library and dtype (None: plain k, v)."""
    quant = [isinstance(x, QuantizedKV) for x in (k, v)]
    if not any(quant):
        return None
    if not all(quant):
        raise TypeError(f"k and v must both be QuantizedKV (a quantized cache's) or both arrays, got "
                        f"{type(k).__name__} and {type(v).__name__}")
    validate.check_array("q", q)
    if q.ndim != 4 or int(q.shape[0]) != k.shape[0]:
        raise ValueError(f"q must be (B, H, Tq, D) with the B={k.shape[0]} sequences of its quantized k and v, "
                         f"got shape {tuple(q.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must hold the same sequences, heads and keys, got {k.shape} and {v.shape}")
    if validate.is_torch(q):
        import torch

        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        return zero.expand(k.shape), zero.expand(v.shape)
    zero = np.zeros((), dtype=q.dtype)
    return np.broadcast_to(zero, k.shape), np.broadcast_to(zero, v.shape)


class Tiles:
    """A QuantizedKV seen as a canonical (B·H_kv, Tk, D) array of ``dtype`` that the blockwise loop slices
    (``x[:, k0:k1]``): each slice is dequantized when taken. ``numpy``: slices come back as NumPy arrays."""

    def __init__(self, x: QuantizedKV, dtype: Any, numpy: bool = False):
        B, H, tk, d = x.shape
        self.x, self.work, self.numpy = x, dtype, numpy
        self.shape = (B * H, tk, d)

    def __getitem__(self, index: tuple) -> Any:
        rows, keys = index
        if rows != slice(None) or not isinstance(keys, slice) or keys.step not in (None, 1):
            raise IndexError(f"a quantized cache is read one block of keys at a time ([:, k0:k1]), got {index!r}")
        start, stop, _ = keys.indices(self.shape[1])
        tile = self.x.dequantize(start, stop).reshape(self.shape[0], stop - start, self.shape[2])  # (B·H_kv, n, D)
        if self.numpy:
            return tile.cpu().numpy().astype(self.work, copy=False)
        return tile.to(self.work)

    def norm_bound(self, like: Any) -> Any:
        """(B·H_kv, 1) in ``like``'s dtype: a bound of every row's length, the stored one (no pass over the codes)."""
        if validate.is_torch(like):
            return like.new_full((self.shape[0], 1), self.x.norm)
        return np.full((self.shape[0], 1), self.x.norm, dtype=like.dtype)


def rotated_q(q: Any, k: Any) -> Any:
    """q (..., D) turned by the Hadamard rotation that ``k``'s keys were stored under (q unchanged otherwise):
    q'·(Hd k) = q·k, Hd being orthogonal and symmetric."""
    if not (isinstance(k, QuantizedKV) and k.rotated):
        return q
    h = hadamard(q.shape[-1])
    if validate.is_torch(q):
        import torch

        return q @ torch.from_numpy(h).to(dtype=q.dtype, device=q.device)
    return q @ h.astype(q.dtype)

