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

The tricks above are for a loop of library calls; :mod:`attnlab.backends.kernel` is the same
algorithm compiled, with its tiles in cache. :func:`backward` (FlashAttention-2's) serves both, on
either forward's LSE. One code path serves NumPy and torch (:class:`~attnlab.backends.tiling.Lib`);
the shapes are the canonical ones of :mod:`attnlab.backends.tiling`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnlab.backends.tiling import LOG2E, Lib, Tiling, block_sizes, spans

HEADROOM = 64.0  # largest s − m (base 2) let into exp2: 2^64·Tk·|v| stays far inside float32's 2^128
LAZY = 32.0  # a row's reference is raised only when a tile beats it by more than this (base 2)
ROWS_BLOCK = 4096  # keys per block when the weights of chosen rows are recomputed


def _with_column(lib: Lib, x: Any, column: Any) -> Any:
    """x (..., T, D) with one more last column, (..., T, D + 1)."""
    return lib.xp.concatenate([x, column], axis=-1)


def _rebase(lib: Lib, s: Any, qb: Any, acc: Any) -> None:
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


def forward(q: Any, k: Any, v: Any, tiling: Tiling, *, scale: float, block_size: Any = None,
            sinks: Any = None) -> tuple[Any, Any]:
    """Online-softmax attention: q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv) → out (B, G, Tq, Dv), LSE (B, G, Tq).

    A Python loop over tiles of NumPy or torch operations, in q's dtype (any device, mask, bias).
    Rows with nothing to attend to give zeros and LSE −inf. ``block_size``: see :func:`block_sizes`.
    ``sinks`` (B, G): learned sink logits, a term of every row's softmax with no value (each row starts
    with its sink as its reference and a sum of 1; the LSE counts it, a row that sees no key gives zeros).
    """
    block_q, block_k = block_sizes(q.shape[0] * q.shape[1], q.shape[2], block_size)
    lib = Lib(q)
    xp = lib.xp
    b, g, tq, d = q.shape
    dv = v.shape[-1]
    # One key block of k and of v, each with an extra column of ones, refilled per tile (whole
    # copies would add (Tk, D + 1) and (Tk, Dv + 1) to the memory; a block copy is ~1 % of a tile's GEMMs).
    span = min(block_k + block_q, k.shape[1])  # the widest span of keys (a band's edge: a query block and a key block)
    kb = lib.ones((b, span, d + 1), q)  # (B, span, D + 1): the ones subtract m inside the GEMM
    vb = lib.ones((b, span, dv + 1), q)  # (B, span, Dv + 1): the ones sum the weights
    # (B, 1): the largest |k| of each batch (a quantized cache's Tiles: its stored bound)
    k_norm = k.norm_bound(q) if hasattr(k, "norm_bound") else xp.amax(lib.row_norms(k), axis=-1)[:, None]
    out, lse = lib.zeros((b, g, tq, dv), q), lib.zeros((b, g, tq), q)
    scratch = lib.zeros((0,), q)  # one flat score buffer, grown to the largest tile, reused for every shape
    for i0 in range(0, tq, block_q):
        i1 = min(i0 + block_q, tq)
        r = i1 - i0
        qs = q[:, :, i0:i1] * (scale * LOG2E)  # (B, G, r, D): base-2 scores
        qb = _with_column(lib, qs, lib.zeros((b, g, r, 1), q)).reshape(b, g * r, d + 1)  # (B, G·r, D + 1)
        bound = xp.sqrt(xp.sum(qs * qs, axis=-1)).reshape(b, g * r) * k_norm  # ≥ every raw score of the rows
        acc = lib.zeros((b, g * r, dv + 1), q)
        if sinks is not None:  # the sink is the first "key" every row has seen: reference m = sink, sum 1
            qb[..., -1] = -(sinks * LOG2E)[:, :, None].expand(b, g, r).reshape(b, g * r) if lib.torch else \
                -np.repeat(sinks * LOG2E, r, axis=1)
            acc[..., -1] = 1.0
        safe = False
        for k0, k1, parts in spans(tiling, i0, i1, g, block_k):
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
                tiling.mask_tile(lib, sp.reshape(b, g, (c - a) // g, kk1 - kk0), rows, kk0, kk1, cut, qb[:, ra, -1])
                if not safe:
                    _rebase(lib, sp, qb[:, ra], acc[:, ra])
                xp.exp2(sp, out=sp)
                lib.add_matmul_(acc[:, ra], sp, vb[:, rc])  # (B, part rows, Dv + 1)
            if not safe:
                safe = (
                    not tiling.rescales
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
    lib = Lib(q)
    xp = lib.xp
    b, g, _, d = q.shape
    idx = lib.asarray(np.asarray(rows)) if lib.torch else np.asarray(rows)
    r = len(rows)
    qr = (q[:, :, idx] * (scale * LOG2E)).reshape(b, g * r, d)  # (B, G·R, D)
    # (B, G·R, Tk), by key blocks: a quantized cache's keys are dequantized a block at a time
    s = xp.concatenate([xp.matmul(qr, k[:, k0:k0 + ROWS_BLOCK].swapaxes(-1, -2)) for k0 in range(0, tiling.tk, ROWS_BLOCK)],
                       axis=-1)
    s4 = s.reshape(b, g, r, tiling.tk)
    tiling.mask_tile(lib, s4, np.asarray(rows), 0, tiling.tk, True)
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
    lib = Lib(q)
    xp = lib.xp
    b, g, tq, d = q.shape
    block_q, block_k = block_sizes(b * g, tq, block_size)
    dv_dim = v.shape[-1]
    delta = xp.sum(dout * out, axis=-1)  # (B, G, Tq)
    if dlse is not None:
        delta = delta - dlse
    kx = _with_column(lib, k, lib.ones((b, k.shape[1], 1), k))  # (B, Tk, D + 1)
    lse0 = xp.where(xp.isfinite(lse), lse * LOG2E, 0.0)  # base 2; dead rows: every score is −inf already
    cap = None if tiling.visible is None or tiling.visible.softcap is None else tiling.visible.softcap * LOG2E
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
            capped = None if cap is None else xp.tanh((p - qb[..., -1:]) / cap)  # softcap's tanh, for dS's 1 − t²
            tiling.mask_tile(lib, p.reshape(b, g, r, k1 - k0), slice(i0, i1), k0, k1, edge, qb[..., -1])
            xp.exp2(p, out=p)
            dv[:, k0:k1] += xp.matmul(p.swapaxes(-1, -2), do)
            ds = xp.matmul(do, v[:, k0:k1].swapaxes(-1, -2))  # dP, (B, G·r, bk)
            ds -= di
            ds *= p
            if capped is not None:
                ds *= 1 - capped * capped
            dqb += xp.matmul(ds, k[:, k0:k1])
            dk[:, k0:k1] += xp.matmul(ds.swapaxes(-1, -2), qraw)
        dq[:, :, i0:i1] = (dqb * scale).reshape(b, g, r, d)
    dk *= scale
    return dq, dk, dv


def sink_grad(sinks: Any, out: Any, lse: Any, dout: Any, dlse: Any) -> Any:
    """The gradient of learned sink logits (B, G) from the forward's out (B, G, Tq, Dv) and LSE (B, G, Tq).

    The sink's weight in row i is p_i = exp(sink − LSE_i) and it has no value, so
    ∂L/∂sink = −Σ_i p_i · (Σ_d dout_id · out_id − dLSE_i): O(Tq), no tile.
    """
    xp = Lib(out).xp
    delta = xp.sum(dout * out, axis=-1)  # (B, G, Tq)
    if dlse is not None:
        delta = delta - dlse
    p = xp.exp(sinks[..., None] - lse)  # (B, G, Tq)
    return -xp.sum(p * delta, axis=-1)


def merge(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """Attention over the keys of A and B together, from the two partial results and their LSEs.

    out (..., Tq, Dv), lse (..., Tq), NumPy or torch. o = (e^{lse_a}·o_a + e^{lse_b}·o_b) / (e^{lse_a} + e^{lse_b}),
    lse = log(e^{lse_a} + e^{lse_b}): how split-key (and ring) attention combines its pieces. A row
    with nothing to attend to in either part stays zero with LSE −inf.
    """
    xp = Lib(out_a).xp
    lse = xp.logaddexp(lse_a, lse_b)
    live = xp.isfinite(lse)
    safe = xp.where(live, lse, 0.0)
    wa = xp.where(live, xp.exp(lse_a - safe), 0.0)[..., None]
    wb = xp.where(live, xp.exp(lse_b - safe), 0.0)[..., None]
    return wa * out_a + wb * out_b, lse
