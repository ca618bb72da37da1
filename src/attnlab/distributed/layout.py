"""How a sequence is split between the ranks of a ring, and which keys each block of a rank sees.

Two layouts (``layout=`` of :func:`~attnlab.distributed.ring.ring_attention`):

- ``"contiguous"``: rank r holds rows ``offsets[r] .. offsets[r + 1] − 1``, in order. Shards may
  differ in length (:func:`shard_lengths` gives the first ``n mod p`` ranks one row more).
- ``"zigzag"``: the sequence is cut into 2p chunks and rank r holds chunk r followed by chunk
  2p − 1 − r (its shard is the two halves, each of half its length). Under a causal mask every
  rank then has the same work, where with ``contiguous`` the last rank has p times the first's.
  Every shard must have an even length; chunk lengths may differ between ranks.

In both layouts a rank's rows keep their global order, so under a causal mask the keys of any
block that a query sees are a *prefix* of the block: a query row is described by how many of the
block's keys it sees, a staircase that :func:`plan_block` cuts into rectangles of two kinds, whole
(every row sees the same prefix) and bottom-right causal (each row sees one key more than the row
before). Those are exactly the calls a blockwise kernel makes with a :class:`~attnlab.backends.tiling.Tiling`.
This module is pure NumPy: the plan is testable without processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.reference.validate import is_torch

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout: Any) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return layout


def shard_lengths(n: int, world: int, layout: str = "contiguous") -> list[int]:
    """Rows per rank when a sequence of ``n`` rows is split over ``world`` ranks in ``layout``."""
    check_layout(layout)
    if world < 1 or n < world * (2 if layout == "zigzag" else 1):
        raise ValueError(f"cannot split n={n} rows over world={world} ranks in layout {layout!r}: "
                         f"every rank needs {'two rows (one per chunk)' if layout == 'zigzag' else 'a row'}")
    if layout == "zigzag":
        if n % 2:
            raise ValueError(f"layout 'zigzag' needs an even sequence length (two chunks per rank), got n={n}")
        return [2 * h for h in _split(n // 2, world)]
    return _split(n, world)


def _split(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


def positions(lengths: list[int], layout: str = "contiguous") -> list[np.ndarray]:
    """The global row index of every local row, per rank: ``positions(...)[r]`` is (lengths[r],) int64.

    Raises ValueError when a zigzag shard has an odd length.
    """
    check_layout(layout)
    p = len(lengths)
    if layout == "contiguous":
        starts = np.concatenate([[0], np.cumsum(lengths)])
        return [np.arange(starts[r], starts[r + 1], dtype=np.int64) for r in range(p)]
    odd = [(r, n) for r, n in enumerate(lengths) if n % 2]
    if odd:
        raise ValueError(
            "layout 'zigzag' needs an even shard length on every rank (its two chunks are its halves), got "
            + ", ".join(f"rank {r}: {n} rows" for r, n in odd)
        )
    owners = list(range(p)) + list(range(p - 1, -1, -1))  # chunk c belongs to rank c, or 2p − 1 − c
    sizes = [lengths[o] // 2 for o in owners]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    chunk = [np.arange(starts[c], starts[c + 1], dtype=np.int64) for c in range(2 * p)]
    return [np.concatenate([chunk[r], chunk[2 * p - 1 - r]]) for r in range(p)]


def _index(x: Any, idx: np.ndarray, dim: int) -> Any:
    if is_torch(x):
        import torch

        return x.index_select(dim, torch.from_numpy(idx).to(x.device))
    return np.take(x, idx, axis=dim)


def shard(x: Any, rank: int, world: int, layout: str = "contiguous", dim: int = -2) -> Any:
    """Rank ``rank``'s shard of a whole sequence ``x`` (rows along ``dim``), NumPy or torch (a copy)."""
    lengths = shard_lengths(x.shape[dim], world, layout)
    if not 0 <= rank < world:
        raise ValueError(f"rank must lie in 0..world-1={world - 1}, got {rank}")
    return _index(x, positions(lengths, layout)[rank], dim)


def unshard(pieces: list, layout: str = "contiguous", dim: int = -2) -> Any:
    """The whole sequence from every rank's shard (``pieces[r]`` from rank r): the inverse of :func:`shard`."""
    lengths = [p.shape[dim] for p in pieces]
    order = np.argsort(np.concatenate(positions(lengths, layout)))  # whole row i is row order[i] of the concatenation
    if is_torch(pieces[0]):
        import torch

        return _index(torch.cat(list(pieces), dim=dim), order, dim)
    return _index(np.concatenate(pieces, axis=dim), order, dim)


@dataclass(frozen=True)
class Rect:
    """Query rows q0..q1−1 of a rank against the first ``keys`` keys of a block.

    ``causal``: bottom-right aligned (row q1 − 1 sees all ``keys``, each row above one key fewer),
    the :class:`~attnlab.backends.tiling.Tiling` ``(q1 − q0, keys, left=None, right=0)``; else every row sees all.
    """

    q0: int
    q1: int
    keys: int
    causal: bool

    @property
    def scores(self) -> int:
        """How many query-key pairs the rectangle visits."""
        rows = self.q1 - self.q0
        return rows * self.keys - (rows * (rows - 1) // 2 if self.causal else 0)


def plan_block(qpos: np.ndarray, kpos: np.ndarray, causal: bool) -> list[Rect]:
    """The rectangles that cover exactly what queries at ``qpos`` see of keys at ``kpos``.

    qpos (Tq,), kpos (Tk,): increasing global positions (queries already shifted to key positions).
    Causal: query at position a sees keys at positions ≤ a. Rows that see nothing are in no rectangle.
    """
    nq, nk = len(qpos), len(kpos)
    if nq == 0 or nk == 0:
        return []
    if not causal:
        return [Rect(0, nq, nk, False)]
    if (np.diff(kpos) <= 0).any() or (np.diff(qpos) <= 0).any():
        raise ValueError("plan_block needs increasing positions (both layouts keep each rank's rows in order)")
    seen = np.searchsorted(kpos, qpos, side="right")  # (Tq,) keys each row sees: a prefix, nondecreasing
    first = int(np.searchsorted(seen, 0, side="right"))  # rows before it see nothing
    rects: list[Rect] = []
    i = first
    step = np.diff(seen)  # step[j]: seen[j + 1] − seen[j]
    while i < nq:
        j, kind = i, 0
        if i + 1 < nq and step[i] in (0, 1):  # a run of equal steps: 0 = whole rows, 1 = the causal diagonal
            kind = int(step[i])
            change = np.flatnonzero(step[i:] != kind)
            j = i + (int(change[0]) if len(change) else nq - 1 - i)  # the run covers rows i..j
        rects.append(Rect(i, j + 1, int(seen[j]), kind == 1))  # a whole run: seen[j] == seen[i]
        i = j + 1
    return rects
