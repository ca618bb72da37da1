"""Rows of key intervals: how a structured mask is stored and combined.

A row (one query of one sequence and head) sees the keys of at most :data:`MAX_SPANS` half-open
intervals [lo, hi). Arrays ``lo``, ``hi`` have shape (B, H, Tq, n), broadcast over B and H where the
mask does not depend on them; an empty interval has hi <= lo (stored as 0, 0). Causal, a window, a
document, a prefix, key lengths and sink tokens are one interval each; ``&`` intersects, ``|`` unites,
and two intervals per row cover every combination the kernel serves (a window with sink tokens, a
prefix-LM inside documents). A union that needs more is not structured: blockwise evaluates it.
"""

from __future__ import annotations

import numpy as np

MAX_SPANS = 2


class NotStructured(Exception):
    """A combination whose rows need more than MAX_SPANS intervals (or a callable or a dense array)."""


def normalise(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same rows as sorted, disjoint, non-adjacent intervals, at most MAX_SPANS of them.

    lo, hi (..., n) → (..., m), m <= MAX_SPANS; raises NotStructured where a row needs more.
    """
    empty = hi <= lo
    big = np.iinfo(np.int64).max
    lo = np.where(empty, big, lo)
    hi = np.where(empty, big, hi)
    order = np.argsort(lo, axis=-1, kind="stable")
    lo, hi = np.take_along_axis(lo, order, -1), np.take_along_axis(hi, order, -1)
    cur_lo, cur_hi = lo[..., 0], hi[..., 0]  # the run being built, per row
    out_lo, out_hi = [], []  # finished runs (big where a row finished none at that column)
    for c in range(1, lo.shape[-1]):  # at most 4 columns: a loop over them, vectorised over rows
        a, z = lo[..., c], hi[..., c]
        new = (a != big) & (a > cur_hi)  # starts after the run ends (touching joins it)
        out_lo.append(np.where(new, cur_lo, big))
        out_hi.append(np.where(new, cur_hi, big))
        cur_hi = np.where(new, z, np.where(a != big, np.maximum(cur_hi, z), cur_hi))
        cur_lo = np.where(new, a, cur_lo)
    out_lo.append(cur_lo)
    out_hi.append(cur_hi)
    lo, hi = np.stack(out_lo, -1), np.stack(out_hi, -1)
    order = np.argsort(lo, axis=-1, kind="stable")  # the merged-away slots (big) go last
    lo, hi = np.take_along_axis(lo, order, -1), np.take_along_axis(hi, order, -1)
    used = int((lo != big).sum(-1).max()) if lo.size else 0
    if used > MAX_SPANS:
        raise NotStructured(f"a row sees {used} separate runs of keys (at most {MAX_SPANS} are stored per row)")
    m = max(used, 1)
    lo, hi = lo[..., :m], hi[..., :m]
    dead = lo == big
    return np.where(dead, 0, lo), np.where(dead, 0, hi)


def both(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The intersection of two rows of intervals (&)."""
    (alo, ahi), (blo, bhi) = a, b
    lo = np.maximum(alo[..., :, None], blo[..., None, :])  # (..., na, nb): every pair's overlap
    hi = np.minimum(ahi[..., :, None], bhi[..., None, :])
    return normalise(lo.reshape(*lo.shape[:-2], -1), hi.reshape(*hi.shape[:-2], -1))


def either(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The union of two rows of intervals (|)."""
    (alo, ahi), (blo, bhi) = a, b
    shape = np.broadcast_shapes(alo.shape[:-1], blo.shape[:-1])
    lo = np.concatenate([np.broadcast_to(alo, (*shape, alo.shape[-1])), np.broadcast_to(blo, (*shape, blo.shape[-1]))], -1)
    hi = np.concatenate([np.broadcast_to(ahi, (*shape, ahi.shape[-1])), np.broadcast_to(bhi, (*shape, bhi.shape[-1]))], -1)
    return normalise(lo, hi)


def contains(lo: np.ndarray, hi: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Whether each row's intervals hold each key of ``cols``: lo, hi (..., r, n), cols (c,) → (..., r, c)."""
    j = cols[None, :, None]  # (1, c, 1)
    return ((lo[..., :, None, :] <= j) & (j < hi[..., :, None, :])).any(-1)
