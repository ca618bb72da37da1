"""Which scores a blockwise pass visits: the band, key padding, a mask and a bias, tile by tile.

The shapes are canonical: q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv), where B is every leading
dim flattened and G the query heads sharing one key/value head (1 without grouped-query attention).
:class:`Lib` holds the few operations where NumPy and torch differ, so one code path serves both.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.reference.masks import band_mask
from attnlab.reference.validate import is_torch

LOG2E = 1.4426950408889634  # scores are kept in base 2 (s·log2 e): exp2 is ~3x cheaper than exp on CPUs
# Scores per tile, all heads together: 4 MB in float32. Not an L2-sized 1 MB tile: every operation
# on a tile is one fork-join of the BLAS/OpenMP threads, and on a shared machine a join waits for a
# descheduled thread (a time slice), so fewer, bigger tiles make a Python loop faster there.
TILE_ELEMENTS = 1 << 20
MIN_HEAD_TILE = 1 << 15  # but at least 128 × 256 per head: smaller GEMMs waste more than cache misses


class Lib:
    """The few operations where NumPy and torch differ; everything else is spelled the same."""

    def __init__(self, like: Any) -> None:
        self.torch = is_torch(like)
        if self.torch:
            import torch

            self.xp, self.device = torch, like.device
        else:
            self.xp, self.device = np, None

    def asarray(self, a: np.ndarray) -> Any:
        if not self.torch:
            return a
        return self.xp.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def zeros(self, shape: tuple, like: Any) -> Any:
        return like.new_zeros(shape) if self.torch else np.zeros(shape, like.dtype)

    def ones(self, shape: tuple, like: Any) -> Any:
        return like.new_ones(shape) if self.torch else np.ones(shape, like.dtype)

    def add_matmul_(self, acc: Any, a: Any, b: Any) -> None:
        """acc += a @ b for 3-D batches, without a temporary in torch."""
        if self.torch:
            acc.baddbmm_(a, b)
        else:
            acc += a @ b

    def row_norms(self, x: Any) -> Any:
        """|x| over the last axis, without an x² temporary (which would be as big as x)."""
        if self.torch:
            return self.xp.linalg.vector_norm(x, dim=-1)
        return np.sqrt(np.einsum("...d,...d->...", x, x))

    def hide_(self, s: Any, keep: Any) -> None:
        """s = −inf where ``keep`` is False, in place (``keep`` broadcasts to s)."""
        if self.torch:
            s.masked_fill_(~keep, -math.inf)
        else:
            np.copyto(s, -np.inf, where=~keep)

    def fill_hidden_(self, s: Any, hidden: Any) -> None:
        """s = −inf where ``hidden`` is True, in place (no negated copy of the mask per tile)."""
        if self.torch:
            s.masked_fill_(hidden, -math.inf)
        else:
            np.copyto(s, -np.inf, where=hidden)


@dataclass(frozen=True)
class Tiling:
    """Which scores exist: the band, key-padding lengths, a boolean mask and an additive bias.

    ``left``/``right``: query i sees keys pos(i) − left .. pos(i) + right, pos(i) = Tk − Tq + i
    (None = unbounded; causal is right = 0), or with ``ends`` (B, G) (NumPy ints: causal with lengths)
    each sequence's own, pos(i) = ends − Tq + i. ``klen`` (B, G): keys j ≥ klen are padding.
    ``mask`` (bool, True = may attend) and ``bias`` are views broadcast to (..., G, Tq, Tk) whose
    leading dims flatten to B; a tile of them is copied out only when visited.
    """

    tq: int
    tk: int
    left: int | None = None
    right: int | None = None
    klen: Any = None
    mask: Any = None
    bias: Any = None
    ends: np.ndarray | None = None

    @property
    def _offsets(self) -> tuple[int, int]:
        """The least and the greatest pos(i) − i over the sequences."""
        if self.ends is None:
            return self.tk - self.tq, self.tk - self.tq
        return int(self.ends.min()) - self.tq, int(self.ends.max()) - self.tq

    def _klen_range(self) -> tuple[int, int]:
        if self.klen is None:
            return self.tk, self.tk
        return int(self.klen.min()), int(self.klen.max())

    def key_blocks(self, i0: int, i1: int, block_k: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, bool]]:
        """(k0, k1, edge) for the key blocks (of keys start..stop−1) that queries i0..i1−1 may see; edge: the band cuts the tile."""
        p0, p1 = i0 + self._offsets[0], i1 - 1 + self._offsets[1]  # the first and last query's positions
        lo, hi = start, self._klen_range()[1] if stop is None else min(stop, self._klen_range()[1])
        if self.left is not None:
            lo = max(lo, p0 - self.left)
        if self.right is not None:
            hi = min(hi, p1 + self.right + 1)
        for k0 in range(lo, hi, block_k):
            k1 = min(k0 + block_k, hi)
            edge = (self.left is not None and k0 < p1 - self.left) or (
                self.right is not None and k1 - 1 > p0 + self.right
            )
            yield k0, k1, edge

    def mask_tile(self, lib: Lib, s4: Any, rows: Any, k0: int, k1: int, edge: bool) -> None:
        """Hide (−inf) and bias the scores s4 (B, G, r, k1 − k0) of queries ``rows``, in place."""
        if edge and self.ends is not None:  # each sequence's band: (B, G, r, k1 − k0)
            idx = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else np.asarray(rows)
            hidden = ~band_mask(self.tq, self.tk, left=self.left, right=self.right, rows=idx, cols=np.arange(k0, k1),
                                lengths=self.ends)
            lib.fill_hidden_(s4, lib.asarray(hidden))
        elif edge:
            if isinstance(rows, slice):  # a tile's band depends only on where it sits relative to the diagonal
                p0, p1 = rows.start + self._offsets[0], rows.stop - 1 + self._offsets[0]
                # only the columns left of p1 − left and right of p0 + right hold hidden scores: fill those
                for c0, c1 in (
                    (k0, min(k1, p1 - self.left) if self.left is not None else k0),
                    (max(k0, p0 + self.right + 1) if self.right is not None else k1, k1),
                ):
                    if c1 > c0:
                        hidden = _band_hidden(self.left, self.right, c0 - p0, rows.stop - rows.start, c1 - c0)
                        lib.fill_hidden_(s4[..., c0 - k0 : c1 - k0], lib.asarray(hidden))
            else:
                hidden = ~band_mask(self.tq, self.tk, left=self.left, right=self.right, rows=np.asarray(rows), cols=np.arange(k0, k1))
                lib.fill_hidden_(s4, lib.asarray(hidden))
        if self.klen is not None and k1 > self._klen_range()[0]:
            cols = lib.asarray(np.arange(k0, k1))
            lib.hide_(s4, cols < self.klen[..., None, None])  # (B, G, 1, bk)
        rows = lib.asarray(rows) if lib.torch and not isinstance(rows, slice) else rows
        if self.mask is not None:
            lib.hide_(s4, self.mask[..., rows, k0:k1].reshape(s4.shape))
        if self.bias is not None:  # the kernels work in base 2
            s4 += self.bias[..., rows, k0:k1].reshape(s4.shape) * LOG2E


@functools.lru_cache(maxsize=64)
def _band_hidden(left: int | None, right: int | None, shift: int, rows: int, cols: int) -> np.ndarray:
    """What the band hides in a (rows, cols) tile whose first key sits ``shift`` after its first query's position."""
    return ~band_mask(rows, rows, left=left, right=right, rows=np.arange(rows), cols=np.arange(shift, shift + cols))


def block_sizes(batch: int, tq: int, block_size: Any = None) -> tuple[int, int]:
    """(queries, keys) per tile: ``block_size`` int (both) or pair; default ~TILE_ELEMENTS scores.

    Keys come in blocks of 512 (256 when many heads share the tile), queries in a power of two that
    fills the tile (2048 × 512 for one head, 256 × 256 for 12). A band (causal, window) needs no
    smaller query block: the tiles on its edge are split into row parts (:func:`_spans`).
    """
    if block_size is None:
        per_head = max(TILE_ELEMENTS // batch, MIN_HEAD_TILE)
        bk = 512 if per_head >= 1 << 18 else 256
        bq = 1 << max(0, (per_head // bk).bit_length() - 1)  # a power of two: tiles divide n = 2^k
        bq = min(tq, bq)
        return bq, bk
    pair = (block_size, block_size) if not isinstance(block_size, (tuple, list)) else tuple(block_size)
    if len(pair) != 2 or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in pair):
        raise ValueError(f"block_size must be an int >= 1 or a pair (queries, keys) of them, got {block_size!r}")
    return int(pair[0]), int(pair[1])


def spans(tiling: Tiling, i0: int, i1: int, g: int, block_k: int) -> Iterator[tuple[int, int, list[tuple]]]:
    """(k0, k1, parts) for the keys k0..k1−1 that queries i0..i1−1 see, a span at a time.

    parts: (a, c, k0', k1', edge) for the rows a..c−1 of the (B, G·r) tile and the keys they see.
    A key block inside the band is one span with one part. The key blocks that the band's edge cuts
    (the diagonal, for causal) are merged into one span and split into parts of block_k / 2 query
    rows, each cut where the band ends for it: whole tiles on the diagonal would compute (and throw
    away) r²/2 hidden scores, and large query blocks are what make the rest fast. Rows of several
    query heads (G > 1) interleave: not split.
    """
    r = i1 - i0
    split = g == 1 and r > block_k // 2
    run: list[tuple[int, int]] = []

    def merged() -> tuple[int, int, list[tuple]]:
        e0, e1, sub = run[0][0], run[-1][1], max(block_k // 2, 1)
        parts = [
            (a, min(a + sub, r), kk0, kk1, cut)
            for a in range(0, r, sub)
            for kk0, kk1, cut in tiling.key_blocks(i0 + a, min(i0 + a + sub, i1), e1 - e0, start=e0, stop=e1)
        ]
        return e0, e1, parts

    for k0, k1, edge in tiling.key_blocks(i0, i1, block_k):
        if run and (not edge or k1 - run[0][0] > i1 - i0 + block_k):  # a span fits forward's k/v buffers
            yield merged()
            run = []
        if edge and split:
            run.append((k0, k1))
            continue
        yield k0, k1, [(0, g * r, k0, k1, edge)]
    if run:
        yield merged()


