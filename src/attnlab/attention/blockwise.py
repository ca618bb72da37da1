"""Blockwise attention: the online softmax of FlashAttention, for NumPy arrays and torch tensors.

The scores are visited one tile (a block of queries × a block of keys) at a time and never held
whole, so the extra memory is O((Tq + Tk)·D + tile) instead of O(Tq·Tk). Each query row keeps a
running reference m (a score it has seen), a running sum l = Σ exp(s − m) and an accumulator
acc = Σ exp(s − m)·v; when a tile raises the row's maximum, l and acc are rescaled by exp(m − m').
At the end o = acc / l and the row's log-sum-exp is LSE = m + log l.

Two tricks keep the passes over each tile few (on a CPU that is what the time goes to):

- q carries an extra column −m and k an extra column of ones, so one GEMM gives s − m directly;
  each key block of v gets a column of ones, so the second GEMM also sums the weights (l comes
  for free).
- The maximum is looked for only while it may matter: once every row of a query block has seen a
  score and the Cauchy–Schwarz bound scale·|q_i|·max|k| − m_i stays below ``HEADROOM`` (no
  exp can overflow), the remaining tiles skip the max pass and the rescale (FlashAttention-4's
  lazy rescaling, with a bound in place of a guess). With a ``bias`` every tile is checked.
- Scores are kept in base 2 (q is multiplied by scale·log2 e once), so the tile needs exp2, which
  vectorises about three times faster than exp; LSE = ln 2·(m + log2 l).

Tiles that a causal or sliding-window band empties are never visited; the last key block of a
query block is cut where the band ends, so causal attention does about half the work.

Float32 on the CPU without a dense mask or bias, :func:`forward` runs the compiled kernel
(:mod:`attnlab.attention.tiles`, the same algorithm in C with its tiles in cache); everything else
goes through the Python loop here, :func:`loop_forward`, whose tricks above are for a loop of
library calls. The backward pass is the loop's, on either forward's LSE.

One code path serves both libraries (through :class:`_Lib`); the shapes it works on are canonical:
q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv), where B is every leading dim flattened and G the query
heads sharing one key/value head (1 without grouped-query attention).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.attention import tiles
from attnlab.attention._checks import is_torch
from attnlab.attention.masks import band_mask

LOG2E = 1.4426950408889634  # scores are kept in base 2 (s·log2 e): exp2 is ~3x cheaper than exp on CPUs
HEADROOM = 64.0  # largest s − m (base 2) let into exp2: 2^64·Tk·|v| stays far inside float32's 2^128
LAZY = 32.0  # a row's reference is raised only when a tile beats it by more than this (base 2)
# Scores per tile, all heads together: 4 MB in float32. Not an L2-sized 1 MB tile: every operation
# on a tile is one fork-join of the BLAS/OpenMP threads, and on a shared machine a join waits for a
# descheduled thread (a time slice, milliseconds), so fewer, bigger tiles run faster there (2048 × 512
# took 0.65-0.7x the time of 512 × 512 for one head at n = 8192, benchmarks/README.md).
TILE_ELEMENTS = 1 << 20
MIN_HEAD_TILE = 1 << 15  # but at least 128 × 256 per head: smaller GEMMs waste more than cache misses


class _Lib:
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
    (None = unbounded; causal is right = 0). ``klen`` (B, G): keys j ≥ klen are padding.
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

    @property
    def _offset(self) -> int:
        return self.tk - self.tq

    def _klen_range(self) -> tuple[int, int]:
        if self.klen is None:
            return self.tk, self.tk
        return int(self.klen.min()), int(self.klen.max())

    def key_blocks(self, i0: int, i1: int, block_k: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, bool]]:
        """(k0, k1, edge) for the key blocks (of keys start..stop−1) that queries i0..i1−1 may see; edge: the band cuts the tile."""
        p0, p1 = i0 + self._offset, i1 - 1 + self._offset  # positions of the first and last query
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

    def mask_tile(self, lib: _Lib, s4: Any, rows: Any, k0: int, k1: int, edge: bool) -> None:
        """Hide (−inf) and bias the scores s4 (B, G, r, k1 − k0) of queries ``rows``, in place."""
        if edge:
            if isinstance(rows, slice):  # a tile's band depends only on where it sits relative to the diagonal
                p0, p1 = rows.start + self._offset, rows.stop - 1 + self._offset
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


def _with_column(lib: _Lib, x: Any, column: Any) -> Any:
    """x (..., T, D) with one more last column, (..., T, D + 1)."""
    return lib.xp.concatenate([x, column], axis=-1)


def _rebase(lib: _Lib, s: Any, qb: Any, acc: Any) -> None:
    """Raise the reference m of rows whose tile beats it by > LAZY (or that see their first score)."""
    xp = lib.xp
    mx = xp.amax(s, axis=-1)  # (B, G·r), relative to m; −inf where the tile hides the whole row
    unseen = acc[..., -1] == 0
    delta = xp.where(xp.isfinite(mx) & (unseen | (mx > LAZY)), mx, 0.0)
    if not bool((delta != 0).any()):
        return
    s -= delta[..., None]
    acc *= xp.exp2(-xp.where(unseen, 0.0, delta))[..., None]  # unseen rows hold zeros: factor 1
    qb[..., -1] -= delta


def _spans(tiling: Tiling, i0: int, i1: int, g: int, block_k: int) -> Iterator[tuple[int, int, list[tuple]]]:
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


def forward(q: Any, k: Any, v: Any, tiling: Tiling, *, scale: float, block_size: Any = None) -> tuple[Any, Any]:
    """Online-softmax attention: q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv) → out (B, G, Tq, Dv), LSE (B, G, Tq).

    Computes in q's dtype (pass float32 or float64). Rows with nothing to attend to give zeros and
    LSE −inf. The compiled kernel (:mod:`attnlab.attention.tiles`) computes what it serves (float32
    on the CPU without a dense mask or bias), the Python loop (:func:`loop_forward`) the rest.
    ``block_size``: see :func:`block_sizes`; each kernel has its own default.
    """
    device, dtype = (str(q.device), str(q.dtype).removeprefix("torch.")) if is_torch(q) else ("cpu", str(q.dtype))
    if tiles.refusal(device, dtype, tiling.mask is not None or tiling.bias is not None) is None:
        bq, bk = tiles.BLOCK if block_size is None else block_sizes(1, q.shape[2], block_size)  # the caller's pair, checked
        return tiles.forward(q, k, v, tiling, scale=scale, block_q=bq, block_k=bk)
    bq, bk = block_sizes(q.shape[0] * q.shape[1], q.shape[2], block_size)
    return loop_forward(q, k, v, tiling, scale=scale, block_q=bq, block_k=bk)


def loop_forward(q: Any, k: Any, v: Any, tiling: Tiling, *, scale: float, block_q: int, block_k: int) -> tuple[Any, Any]:
    """:func:`forward` as a Python loop over tiles of NumPy or torch operations (any dtype, device, mask, bias)."""
    lib = _Lib(q)
    xp = lib.xp
    b, g, tq, d = q.shape
    dv = v.shape[-1]
    # One key block of k and of v, each with an extra column of ones, refilled per tile (whole
    # copies would add (Tk, D + 1) and (Tk, Dv + 1) to the memory; a block copy is ~1 % of a tile's GEMMs).
    span = min(block_k + block_q, k.shape[1])  # the widest span of keys (a band's edge: a query block and a key block)
    kb = lib.ones((b, span, d + 1), k)  # (B, span, D + 1): the ones subtract m inside the GEMM
    vb = lib.ones((b, span, dv + 1), v)  # (B, span, Dv + 1): the ones sum the weights
    k_norm = xp.amax(lib.row_norms(k), axis=-1)[:, None]  # (B, 1): the largest |k| of each batch
    out, lse = lib.zeros((b, g, tq, dv), q), lib.zeros((b, g, tq), q)
    scratch = lib.zeros((0,), q)  # one flat score buffer, grown to the largest tile, reused for every shape
    for i0 in range(0, tq, block_q):
        i1 = min(i0 + block_q, tq)
        r = i1 - i0
        qs = q[:, :, i0:i1] * (scale * LOG2E)  # (B, G, r, D): base-2 scores
        qb = _with_column(lib, qs, lib.zeros((b, g, r, 1), q)).reshape(b, g * r, d + 1)  # (B, G·r, D + 1)
        bound = xp.sqrt(xp.sum(qs * qs, axis=-1)).reshape(b, g * r) * k_norm  # ≥ every raw score of the rows
        acc = lib.zeros((b, g * r, dv + 1), q)
        safe = False
        for k0, k1, parts in _spans(tiling, i0, i1, g, block_k):
            n = k1 - k0
            kb[:, :n, :d] = k[:, k0:k1]
            vb[:, :n, :dv] = v[:, k0:k1]
            for a, c, kk0, kk1, cut in parts:
                ra, rc = slice(a, c), slice(kk0 - k0, kk1 - k0)  # the part's rows (of G·r) and keys (of the block)
                shape = (b, c - a, kk1 - kk0)
                size = b * (c - a) * (kk1 - kk0)
                if scratch.shape[0] < size:  # a buffer per shape would keep every row part's (causal: ~2x the tile)
                    scratch = lib.zeros((max(size, b * g * r * min(block_k, tiling.tk)),), q)
                sp = xp.matmul(qb[:, ra], kb[:, rc].swapaxes(-1, -2), out=scratch[:size].reshape(shape))  # log2 e·scale·q·k − m
                rows = slice(i0 + a, i0 + c) if g == 1 else slice(i0, i1)
                tiling.mask_tile(lib, sp.reshape(b, g, (c - a) // g, kk1 - kk0), rows, kk0, kk1, cut)
                if not safe:
                    _rebase(lib, sp, qb[:, ra], acc[:, ra])
                xp.exp2(sp, out=sp)
                lib.add_matmul_(acc[:, ra], sp, vb[:, rc])  # (B, part rows, Dv + 1)
            if not safe:
                safe = (
                    tiling.bias is None
                    and bool((acc[..., -1] > 0).all())
                    and float(xp.amax(bound + qb[..., -1])) <= HEADROOM
                )
        l = acc[..., -1:]  # (B, G·r, 1)
        live = l > 0
        l1 = xp.where(live, l, 1.0)
        out[:, :, i0:i1] = (acc[..., :dv] / l1).reshape(b, g, r, dv)
        row_lse = xp.where(live, (xp.log2(l1) - qb[..., -1:]) / LOG2E, -math.inf)  # LSE = ln 2·(m + log2 l)
        lse[:, :, i0:i1] = row_lse.reshape(b, g, r)
    return out, lse


def weights_rows(q: Any, k: Any, lse: Any, tiling: Tiling, rows: Any, *, scale: float) -> Any:
    """The exact weights of query ``rows`` (R indices), recomputed from the LSE: (B, G, R, Tk).

    exp(s − LSE) is the softmax without a second pass over the keys; memory is O(R·Tk).
    """
    lib = _Lib(q)
    xp = lib.xp
    b, g, _, d = q.shape
    idx = lib.asarray(np.asarray(rows)) if lib.torch else np.asarray(rows)
    r = len(rows)
    s = xp.matmul((q[:, :, idx] * (scale * LOG2E)).reshape(b, g * r, d), k.swapaxes(-1, -2))  # (B, G·R, Tk)
    s4 = s.reshape(b, g, r, tiling.tk)
    tiling.mask_tile(lib, s4, np.asarray(rows), 0, tiling.tk, tiling.left is not None or tiling.right is not None)
    lr = lse[:, :, idx]  # (B, G, R)
    s4 -= xp.where(xp.isfinite(lr), lr * LOG2E, 0.0)[..., None]
    xp.exp2(s4, out=s4)  # rows with nothing to attend to were −inf throughout: zeros
    return s4


def backward(
    q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, dlse: Any, tiling: Tiling, *, scale: float, block_size: Any = None
) -> tuple[Any, Any, Any]:
    """FlashAttention-2's backward: dq, dk, dv recomputed tile by tile from q, k, v, out and LSE.

    With P = exp(S − LSE) (exact weights, one tile at a time) and Δ_i = Σ_j dout_ij·out_ij:
    dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − Δ + dLSE), dQ = scale·dS K, dK = scale·dSᵀ Q.
    Key/value heads shared by G query heads collect the gradient of all G.
    """
    lib = _Lib(q)
    xp = lib.xp
    b, g, tq, d = q.shape
    block_q, block_k = block_sizes(b * g, tq, block_size)
    dv_dim = v.shape[-1]
    delta = xp.sum(dout * out, axis=-1)  # (B, G, Tq)
    if dlse is not None:
        delta = delta - dlse
    kx = _with_column(lib, k, lib.ones((b, k.shape[1], 1), k))  # (B, Tk, D + 1)
    lse0 = xp.where(xp.isfinite(lse), lse * LOG2E, 0.0)  # base 2; dead rows: every score is −inf already
    dq, dk, dv = lib.zeros(q.shape, q), lib.zeros(k.shape, k), lib.zeros(v.shape, v)
    for i0 in range(0, tq, block_q):
        i1 = min(i0 + block_q, tq)
        r = i1 - i0
        qraw = q[:, :, i0:i1].reshape(b, g * r, d)  # (B, G·r, D)
        qb = _with_column(lib, q[:, :, i0:i1] * (scale * LOG2E), -lse0[:, :, i0:i1, None]).reshape(b, g * r, d + 1)
        do = dout[:, :, i0:i1].reshape(b, g * r, dv_dim)  # (B, G·r, Dv)
        di = delta[:, :, i0:i1].reshape(b, g * r, 1)
        dqb = lib.zeros((b, g * r, d), q)
        for k0, k1, edge in tiling.key_blocks(i0, i1, block_k):
            p = xp.matmul(qb, kx[:, k0:k1].swapaxes(-1, -2))  # (B, G·r, bk) = (S − LSE)·log2 e
            tiling.mask_tile(lib, p.reshape(b, g, r, k1 - k0), slice(i0, i1), k0, k1, edge)
            xp.exp2(p, out=p)
            dv[:, k0:k1] += xp.matmul(p.swapaxes(-1, -2), do)
            ds = xp.matmul(do, v[:, k0:k1].swapaxes(-1, -2))  # dP, (B, G·r, bk)
            ds -= di
            ds *= p
            dqb += xp.matmul(ds, k[:, k0:k1])
            dk[:, k0:k1] += xp.matmul(ds.swapaxes(-1, -2), qraw)
        dq[:, :, i0:i1] = (dqb * scale).reshape(b, g, r, d)
    dk *= scale
    return dq, dk, dv


def merge(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """Attention over the keys of A and B together, from the two partial results and their LSEs.

    out (..., Tq, Dv), lse (..., Tq), NumPy or torch. o = (e^{lse_a}·o_a + e^{lse_b}·o_b) / (e^{lse_a} + e^{lse_b}),
    lse = log(e^{lse_a} + e^{lse_b}): how split-key (and ring) attention combines its pieces. A row
    with nothing to attend to in either part stays zero with LSE −inf.
    """
    xp = _Lib(out_a).xp
    lse = xp.logaddexp(lse_a, lse_b)
    live = xp.isfinite(lse)
    safe = xp.where(live, lse, 0.0)
    wa = xp.where(live, xp.exp(lse_a - safe), 0.0)[..., None]
    wb = xp.where(live, xp.exp(lse_b - safe), 0.0)[..., None]
    return wa * out_a + wb * out_b, lse
