"""Which keys a query sees, as one composable value: :class:`Mask` and its kinds.

Each kind says its rule at (b, h, i, j) (:meth:`Mask.allows`, FlexAttention's ``mask_mod``) and, where it
can, its rows as key intervals (:meth:`Mask.spans`, :mod:`attnlab.masks.intervals`), which is what the
compiled kernel reads to skip every tile no query sees. ``&`` and ``|`` combine kinds; a combination
is structured while every row stays within two intervals, else it is served tile by tile from its rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnlab.masks import intervals
from attnlab.masks.frame import Frame, as_numpy, split_batch, to_bh

Spans = tuple[np.ndarray, np.ndarray]  # lo, hi: (B|1, H|1, Tq, n) int64


def _count(name: str, value: Any, *, low: int = 0, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}{' or None (unbounded)' if none else ''}, got {value!r}")
    return int(value)


def _lengths(name: str, lengths: Any) -> np.ndarray:
    arr = as_numpy(lengths)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be integers (one per sequence), got dtype {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0, got {int(arr.min())}")
    return arr.astype(np.int64)


class Mask:
    """A description of which keys each query sees. Combine with ``&`` (both) and ``|`` (either)."""

    structured = True  # its rows are key intervals (spans); False: a callable or a dense array inside

    def __and__(self, other: Mask) -> Mask:
        return Both(self, as_mask(other, "mask"))

    def __or__(self, other: Mask) -> Mask:
        return Either(self, as_mask(other, "mask"))

    def parts(self) -> tuple[Mask, ...]:
        return ()

    def ends(self) -> np.ndarray | None:
        """The lengths of a :func:`cache_lengths` term (queries placed by them), or None."""
        found = [e for p in self.parts() if (e := p.ends()) is not None]
        if len(found) > 1 and any(f.shape != found[0].shape or (f != found[0]).any() for f in found[1:]):
            raise ValueError("mask holds two cache_lengths terms with different lengths: one description, one rule")
        return found[0] if found else None

    def check(self, frame: Frame) -> None:
        """Raise where the mask does not fit the call (shapes, lengths beyond Tk)."""
        for p in self.parts():
            p.check(frame)

    def spans(self, frame: Frame) -> Spans:
        """Each row's keys as intervals; raises intervals.NotStructured where they are not."""
        raise intervals.NotStructured(f"{self!r} is not made of key intervals")

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        """The rule at broadcasting index arrays (NumPy ints): True where query i may see key j."""
        lo, hi = self.spans(frame)
        lo = lo[b % lo.shape[0], h % lo.shape[1], i]  # (…, n) gathered per (b, h, i)
        hi = hi[b % hi.shape[0], h % hi.shape[1], i]
        return ((lo <= j[..., None]) & (j[..., None] < hi)).any(-1)

    # --- what users call -------------------------------------------------------------------------
    def frame(self, tq: int, tk: int | None = None, batch: tuple = ()) -> Frame:
        tq = _count("tq", tq, low=1)
        tk = tq if tk is None else _count("tk", tk, low=1)
        ends = self.ends()
        frame = Frame.of(tq, tk, batch, ends)
        self.check(frame)
        return frame

    def dense(self, tq: int, tk: int | None = None, batch: tuple = ()) -> np.ndarray:
        """The boolean mask (B, H, Tq, Tk) for a call with leading dims ``batch`` (default none: (1, 1, Tq, Tk))."""
        f = self.frame(tq, tk, batch if batch else self.batch_shape())
        b, h = f.bh
        return np.broadcast_to(self.allows(f, *f.grid()), (b, h, f.tq, f.tk))

    def mask_mod(self, tq: int, tk: int | None = None) -> Callable[..., Any]:
        """A FlexAttention-style ``mask_mod(b, h, q_idx, kv_idx)`` for these lengths, elementwise on
        broadcasting integer arrays or tensors."""
        f = self.frame(tq, tk, self.batch_shape())

        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            arrays = [as_numpy(x).astype(np.int64) for x in (b, h, q_idx, kv_idx)]
            out = np.broadcast_to(self.allows(f, *arrays), np.broadcast_shapes(*(a.shape for a in arrays)))
            if any(type(x).__module__.startswith("torch") for x in (b, h, q_idx, kv_idx)):
                import torch

                return torch.from_numpy(np.ascontiguousarray(out))
            return out

        return mask_mod

    def batch_shape(self) -> tuple:
        """The leading batch dims the mask's own arrays have (its ids', its lengths'), () if none."""
        shapes = [p.batch_shape() for p in self.parts()]
        return tuple(np.broadcast_shapes(*shapes)) if shapes else ()


class Both(Mask):
    def __init__(self, a: Mask, b: Mask):
        self.a, self.b = a, b
        self.structured = a.structured and b.structured

    def parts(self) -> tuple[Mask, ...]:
        return (self.a, self.b)

    def spans(self, frame: Frame) -> Spans:
        return intervals.both(self.a.spans(frame), self.b.spans(frame))

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        return self.a.allows(frame, b, h, i, j) & self.b.allows(frame, b, h, i, j)

    def __repr__(self) -> str:
        return f"({self.a!r} & {self.b!r})"


class Either(Both):
    def spans(self, frame: Frame) -> Spans:
        return intervals.either(self.a.spans(frame), self.b.spans(frame))

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        return self.a.allows(frame, b, h, i, j) | self.b.allows(frame, b, h, i, j)

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"


def _one(frame: Frame, lo: Any, hi: Any) -> Spans:
    """One interval per row, clipped to the keys 0..Tk: (B|1, H|1, Tq, 1) each."""
    lo = np.clip(np.asarray(lo, np.int64), 0, frame.tk)
    hi = np.clip(np.asarray(hi, np.int64), 0, frame.tk)
    lo, hi = np.broadcast_arrays(lo, hi)
    hi = np.where(hi <= lo, 0, hi)
    lo = np.where(hi == 0, 0, lo)
    return lo[..., None], hi[..., None]  # (B|1, H|1, Tq, 1)


class Causal(Mask):
    def spans(self, frame: Frame) -> Spans:
        return _one(frame, 0, frame.positions() + 1)

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        return j <= _pos(frame, b, h, i)

    def __repr__(self) -> str:
        return "causal()"


class Window(Mask):
    def __init__(self, left: int | None, right: int | None):
        self.left = _count("left", left, none=True)
        self.right = _count("right", right, none=True)

    def spans(self, frame: Frame) -> Spans:
        pos = frame.positions()
        lo = 0 if self.left is None else pos - self.left
        hi = frame.tk if self.right is None else pos + self.right + 1
        return _one(frame, np.broadcast_to(lo, pos.shape), hi)

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        pos = _pos(frame, b, h, i)
        keep = np.ones(np.broadcast_shapes(np.shape(pos), np.shape(j)), bool)
        if self.left is not None:
            keep &= j >= pos - self.left
        if self.right is not None:
            keep &= j <= pos + self.right
        return keep

    def __repr__(self) -> str:
        return f"window({self.left}, {self.right})"


def _pos(frame: Frame, b: Any, h: Any, i: Any) -> np.ndarray:
    end = frame.tk if frame.ends is None else frame.ends[b % frame.ends.shape[0], h % frame.ends.shape[1]]
    return end - frame.tq + i


class _PerSequence(Mask):
    """Every query of sequence b sees keys 0..n[b] − 1 (n shaped like a prefix of the batch dims)."""

    what = "lengths"

    def __init__(self, lengths: Any):
        self.n = _lengths(self.what, lengths)

    def batch_shape(self) -> tuple:
        return self.n.shape

    def _n(self, frame: Frame) -> np.ndarray:
        return to_bh(self.what, self.n, frame.batch)  # (B|1, H|1)

    def check(self, frame: Frame) -> None:
        n = self._n(frame)
        if n.size and n.max() > frame.tk:
            raise ValueError(f"{self.what} must lie in 0..Tk={frame.tk}, got up to {int(n.max())}")

    def spans(self, frame: Frame) -> Spans:
        n = self._n(frame)[..., None]  # (B|1, H|1, 1)
        return _one(frame, np.zeros_like(n), np.broadcast_to(n, (*n.shape[:2], frame.tq)))

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        n = self._n(frame)
        return j < n[b % n.shape[0], h % n.shape[1]]

    def __repr__(self) -> str:
        return f"{type(self).__name__.lower()}({self.n.tolist()})"


class KeyLengths(_PerSequence):
    what = "key_lengths"


class Prefix(_PerSequence):
    what = "prefix"


class CacheLengths(_PerSequence):
    what = "cache_lengths"

    def ends(self) -> np.ndarray:
        return self.n


class SinkTokens(Mask):
    def __init__(self, n: int):
        self.n = _count("sink_tokens n", n)

    def spans(self, frame: Frame) -> Spans:
        return _one(frame, np.zeros((1, 1, frame.tq), np.int64), np.full((1, 1, frame.tq), self.n))

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        return (j < self.n) & (i >= 0)

    def __repr__(self) -> str:
        return f"sink_tokens({self.n})"


class Documents(Mask):
    """Queries see the keys of their own document: ids (Tk,) or (*batch prefix, Tk), non-decreasing."""

    def __init__(self, ids: Any):
        arr = as_numpy(ids)
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer) or arr.ndim < 1:
            raise TypeError(f"documents ids must be integers shaped (T,) or (B, T), got {arr.dtype} of shape {arr.shape}")
        if arr.shape[-1] > 1 and (np.diff(arr, axis=-1) < 0).any():
            row = np.argwhere(np.diff(arr, axis=-1) < 0)[0]
            raise ValueError(f"documents ids must be non-decreasing along each row (packed documents lie side by side), "
                             f"got ids[{', '.join(map(str, row[:-1]))}{', ' if row.size > 1 else ''}{row[-1] + 1}] = "
                             f"{arr[tuple(row[:-1]) + (row[-1] + 1,)]} after {arr[tuple(row)]}")
        self.ids = arr.astype(np.int64)

    def batch_shape(self) -> tuple:
        return self.ids.shape[:-1]

    def _ids(self, frame: Frame) -> np.ndarray:
        return to_bh("documents ids", self.ids, frame.batch, trailing=1)  # (B|1, H|1, Tk)

    def check(self, frame: Frame) -> None:
        if self.ids.shape[-1] != frame.tk:
            raise ValueError(f"documents ids must give one id per key (Tk = {frame.tk}), got {self.ids.shape[-1]}")
        self._ids(frame)

    def spans(self, frame: Frame) -> Spans:
        ids = self._ids(frame)
        j = np.arange(frame.tk)
        change = np.ones(ids.shape, bool)
        change[..., 1:] = ids[..., 1:] != ids[..., :-1]
        start = np.maximum.accumulate(np.where(change, j, 0), axis=-1)  # each key's document start
        last = np.ones(ids.shape, bool)
        last[..., :-1] = change[..., 1:]
        end = np.minimum.accumulate(np.where(last, j + 1, frame.tk)[..., ::-1], axis=-1)[..., ::-1]
        pos = frame.positions()  # (B|1, H|1, Tq)
        shape = np.broadcast_shapes(pos.shape, (*ids.shape[:2], frame.tq))
        pos = np.broadcast_to(pos, shape)
        inside = (pos >= 0) & (pos < frame.tk)
        at = np.clip(pos, 0, frame.tk - 1)
        lo = np.take_along_axis(np.broadcast_to(start, (*shape[:2], frame.tk)), at, -1)
        hi = np.take_along_axis(np.broadcast_to(end, (*shape[:2], frame.tk)), at, -1)
        return _one(frame, np.where(inside, lo, 0), np.where(inside, hi, 0))

    def __repr__(self) -> str:
        return f"documents(<ids {self.ids.shape}>)"


class Dense(Mask):
    """A boolean array, True = may attend, broadcastable to (..., Tq, Tk): not structured."""

    structured = False

    def __init__(self, array: Any):
        self.array = array
        self._bh: tuple = (None, None)  # (frame, the array in its (B, H) space), the last frame's

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        if self._bh[0] is not frame:
            arr = as_numpy(self.array)  # broadcastable to (..., Tq, Tk): aligned from the right
            arr = arr.reshape((1,) * max(len(frame.batch) + 2 - arr.ndim, 0) + arr.shape)
            self._bh = (frame, to_bh("mask", arr, frame.batch, trailing=2))  # (B|1, H|1, Tq|1, Tk|1)
        arr = self._bh[1]
        return arr[b % arr.shape[0], h % arr.shape[1], i % arr.shape[2], j % arr.shape[3]]

    def __repr__(self) -> str:
        return f"<dense mask {tuple(self.array.shape)}>"


class MaskMod(Mask):
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``, evaluated elementwise: not structured."""

    structured = False

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def allows(self, frame: Frame, b: Any, h: Any, i: Any, j: Any) -> Any:
        return self.fn(b, h, i, j)

    def __repr__(self) -> str:
        return f"mask_mod({getattr(self.fn, '__name__', type(self.fn).__name__)})"


def as_mask(x: Any, name: str = "mask") -> Mask:
    """A Mask from a Mask, a boolean array or tensor (dense) or a ``mask_mod`` callable."""
    if isinstance(x, Mask):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return Dense(x)
    if callable(x):
        return MaskMod(x)
    raise TypeError(f"{name} must be a boolean array, a mask_mod callable (b, h, q_idx, kv_idx) or an attnlab.masks "
                    f"object, got {type(x).__name__}")


__all__ = ["Mask", "split_batch"]
