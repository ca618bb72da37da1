"""Where the queries and keys of one call sit: :class:`Frame`, and arrays put into its (B, H) index space.

A mask or score change is evaluated at (b, h, i, j): b the index over the flattened batch dims before
the heads, h the head index (0 where q has none: the dim before Tq when q has three dims or more),
i the query (0..Tq − 1) and j the key (0..Tk − 1), FlexAttention's indices. Query i sits at key position
pos(i) = end − Tq + i (bottom-right): end is Tk, or each sequence's length where the description
holds :func:`attnlab.masks.cache_lengths` (a ragged batch of caches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def as_numpy(x: Any) -> np.ndarray:
    """An array or tensor (any device) as a NumPy array."""
    if _is_torch(x):
        x = x.detach().cpu()
        return (x.float() if str(x.dtype) == "torch.bfloat16" else x).numpy()  # NumPy has no bfloat16
    return np.asarray(x)


def split_batch(batch: tuple) -> tuple[int, int]:
    """(B, H) of a call's leading dims: the heads are the last, the rest flatten into B."""
    if not batch:
        return 1, 1
    return int(np.prod(batch[:-1], dtype=np.int64)), int(batch[-1])


def to_bh(name: str, arr: np.ndarray, batch: tuple, trailing: int = 0) -> np.ndarray:
    """``arr``, shaped like a prefix of the call's batch dims (then ``trailing`` dims of its own), as
    (B or 1, H or 1, *trailing): the heads kept where the array has them, else broadcast."""
    lead = arr.shape[: arr.ndim - trailing]
    tail = arr.shape[arr.ndim - trailing :]
    if len(lead) > len(batch) or any(a not in (1, b) for a, b in zip(lead, batch)):
        raise ValueError(f"{name} must be shaped like a prefix of the leading batch dims {batch}"
                         f"{' followed by its own ' + str(trailing) + ' dim(s)' if trailing else ''}, got {arr.shape}")
    if not lead or not batch:
        return arr.reshape(1, 1, *tail)
    full = arr.reshape(*lead, *(1,) * (len(batch) - len(lead)), *tail)  # (*batch-like, *trailing)
    head = full.shape[len(batch) - 1]  # 1 or H
    b = 1
    if any(n > 1 for n in full.shape[: len(batch) - 1]):  # depends on the outer dims: flatten them into B
        full = np.broadcast_to(full, (*batch[:-1], head, *tail))
        b = int(np.prod(batch[:-1], dtype=np.int64))
    return full.reshape(b, head, *tail)


@dataclass(frozen=True, eq=False)
class Frame:
    """One call's geometry: Tq, Tk, the batch dims and each sequence's end (B or 1, H or 1), or None (Tk)."""

    tq: int
    tk: int
    batch: tuple = ()
    ends: np.ndarray | None = None

    @classmethod
    def of(cls, tq: int, tk: int, batch: tuple = (), ends: np.ndarray | None = None) -> Frame:
        """A call's frame; ``ends`` (a cache_lengths term's lengths, shaped like a prefix of ``batch``) put in (B, H)."""
        batch = tuple(batch)
        return cls(tq, tk, batch, None if ends is None else to_bh("cache_lengths", ends, batch))

    @property
    def bh(self) -> tuple[int, int]:
        return split_batch(self.batch)

    def positions(self, rows: Any = None) -> np.ndarray:
        """pos(i) of the query ``rows`` (default all): (B or 1, H or 1, R) int64."""
        i = np.arange(self.tq) if rows is None else np.asarray(rows, dtype=np.int64)
        end = np.full((1, 1), self.tk, np.int64) if self.ends is None else self.ends.astype(np.int64)
        return end[..., None] - self.tq + i  # (B|1, H|1, R)

    def grid(self, rows: Any = None, cols: Any = None) -> tuple[np.ndarray, ...]:
        """Broadcasting index arrays b (B, 1, 1, 1), h (1, H, 1, 1), i (1, 1, R, 1), j (1, 1, 1, C)."""
        b, h = self.bh
        i = np.arange(self.tq) if rows is None else np.asarray(rows, dtype=np.int64)
        j = np.arange(self.tk) if cols is None else np.asarray(cols, dtype=np.int64)
        return (np.arange(b).reshape(b, 1, 1, 1), np.arange(h).reshape(1, h, 1, 1),
                i.reshape(1, 1, -1, 1), j.reshape(1, 1, 1, -1))
