"""Which scores a blockwise pass visits: the band, key padding, a mask and a bias, tile by tile.

The shapes are canonical: q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv), where B is every leading
dim flattened and G the query heads sharing one key/value head (1 without grouped-query attention).
:class:`Lib` holds the few operations where NumPy and torch differ, so one code path serves both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.backends.visible import Visible, describe
from attnlab.masks import Mask
from attnlab.masks.scores import Alibi
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
    """Which scores exist and how they change: the call's :class:`~attnlab.backends.visible.Visible`
    (structured rows of key intervals, a rule, score changes, learned sinks), a dense boolean mask and
    an additive bias.

    ``mask`` (bool, True = may attend) and ``bias`` are views broadcast to (..., G, Tq, Tk) whose
    leading dims flatten to B; a tile of them is copied out only when visited. Tiles are canonical,
    (B·Hkv, G, r, c); the description's index space (B, H) is the same memory seen as (B, Hkv·G, r, c).
    """

    tq: int
    tk: int
    visible: Visible | None = None
    mask: Any = None
    bias: Any = None

    @classmethod
    def of(cls, tq: int, tk: int, mask: Mask | None = None) -> Tiling:
        """The tiling of one (Tq, Tk) rectangle under ``mask`` (an attnlab.masks description, None: all)."""
        return cls(tq, tk, None if mask is None else describe(mask, tq, tk))

    @property
    def rescales(self) -> bool:
        """Scores change beyond q·k (bias, score_mod): the Cauchy–Schwarz bound no longer bounds them."""
        v = self.visible
        return self.bias is not None or (v is not None and (v.score_mod is not None or v.softcap is not None))

    def key_blocks(self, i0: int, i1: int, block_k: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, bool]]:
        """(k0, k1, edge) for the key blocks (of keys start..stop−1) that queries i0..i1−1 may see; edge: some
        row does not see the whole block. Blocks no query sees are skipped."""
        lo, hi = (0, self.tk) if self.visible is None else self.visible.block_range(i0, i1)
        lo, hi = max(lo, start), hi if stop is None else min(stop, hi)
        for k0 in range(lo, hi, block_k):
            k1 = min(k0 + block_k, hi)
            state = "full" if self.visible is None else self.visible.tile_state(i0, i1, k0, k1)
            if state != "empty":
                yield k0, k1, state == "edge"

    def mask_tile(self, lib: Lib, s4: Any, rows: Any, k0: int, k1: int, edge: bool, offset: Any = None) -> None:
        """Bias, change and hide (−inf) the base-2 scores s4 (B, G, r, k1 − k0) of queries ``rows``, in place.

        ``offset`` (B, G·r): what was subtracted from each row's base-2 scores (−m), so that a score_mod
        callable sees the true scores."""
        idx = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else np.asarray(rows)
        v = self.visible
        bh = None if v is None else s4.reshape(*v.frame.bh, *s4.shape[2:])  # (B, H, r, c): the description's space
        off = 0.0 if offset is None else offset.reshape(*s4.shape[:2], -1, 1)  # (B, G, r, 1): each row's shift
        if v is not None and v.softcap is not None:  # c · tanh(s / c) of the true scores, in base 2, first
            cap = v.softcap * LOG2E
            s4[...] = lib.xp.tanh((s4 - off) / cap) * cap + off
        if self.bias is not None:  # the kernels work in base 2
            at = rows if isinstance(rows, slice) else lib.asarray(idx) if lib.torch else idx
            s4 += self.bias[..., at, k0:k1].reshape(s4.shape) * LOG2E
        if v is not None:
            if v.score_mod is not None:
                _change(lib, v, bh, idx, k0, k1, off if offset is None else offset.reshape(*bh.shape[:3], 1))
            if edge or v.rule is not None:
                keep = v.keep(idx, np.arange(k0, k1))
                if keep is not None:
                    lib.hide_(bh, lib.asarray(np.ascontiguousarray(keep)))
        if self.mask is not None:
            at = rows if isinstance(rows, slice) else lib.asarray(idx) if lib.torch else idx
            lib.hide_(s4, self.mask[..., at, k0:k1].reshape(s4.shape))


def _change(lib: Lib, v: Visible, bh: Any, rows: np.ndarray, k0: int, k1: int, off: Any) -> None:
    """Apply the description's score_mod to base-2 scores ``bh`` (B, H, r, c) shifted by ``off``, in place."""
    f = v.frame
    b, h, i, j = f.grid(rows, np.arange(k0, k1))
    if isinstance(v.score_mod, Alibi):  # additive: the row shift needs no undoing
        slope = v.score_mod.per_head(f)  # (1, H)
        dist = np.abs(f.positions(rows)[..., None] - j)  # (B|1, H|1, r, c)
        delta = np.ascontiguousarray(slope[..., None, None] * dist * LOG2E)
        bh -= lib.asarray(delta).to(bh.dtype) if lib.torch else delta.astype(bh.dtype)
        return
    changed = v.score_mod(f, (bh - off) / LOG2E, b, h, i, j)  # the true scores, changed
    bh[...] = changed * LOG2E + off


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


