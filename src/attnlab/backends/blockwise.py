"""The ``blockwise`` backend: attnlab's online-softmax loop (NumPy in, NumPy loop; torch in, torch loop).

It never materialises (Tq, Tk): weights only for chosen rows (``weights_rows=``), recomputed from
the LSE. In torch it is differentiable through FlashAttention-2's backward, which recomputes the
tiles from q, k, v, the output and the LSE instead of storing them. Low-precision inputs are
computed in float32 and returned in their dtype.

The compiled ``kernel`` backend (:mod:`attnlab.backends.kernel`) computes the same thing and shares
the helpers here: :func:`canonical` (the call in the kernels' shapes), :func:`differentiable` and
:func:`results`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.backends import online
from attnlab.backends.base import Backend, Supports, read_seconds, torch_overhead
from attnlab.backends.quantized import Tiles, rotated_q
from attnlab.backends.request import Call, Request
from attnlab.backends.tiling import Tiling
from attnlab.reference.validate import FLOAT_DTYPES

# A rough prior for auto where nothing was measured, per visited score: only the tiles a band leaves are visited.
PRIOR_NS_PER_SCORE = 2.8
PRIOR_OVERHEAD_S = 2e-4  # the Python loop over tiles
QUANTIZED_DECODE_KEYS = 2048  # keys per block for a few query rows over a quantized cache: fewer dequantizing calls


def work_dtype(dtype: str) -> str:
    """The dtype the blockwise kernels compute ``dtype`` in: float32 accumulators at least."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


@dataclass(frozen=True)
class Canonical:
    """A call in the kernels' shapes: q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv) and its :class:`Tiling`."""

    q: Any
    k: Any
    v: Any
    tiling: Tiling
    torch: bool
    sinks: Any = None  # (B, G) learned sink logits of each query head, or None


def canonical(call: Call) -> Canonical:
    p, torch_in = call.problem, call.request.library == "torch"
    xp = np
    if torch_in:
        import torch as xp
    dtype = getattr(xp, work_dtype(p.dtype))
    groups = p.groups
    lead = (*p.batch[:-1], call.k.shape[-3]) if groups > 1 else p.batch  # key/value batch dims
    b = int(np.prod(lead, dtype=np.int64))

    def canon(x: Any, full: tuple, shape: tuple) -> Any:  # broadcast to `full`, then reshape
        x = x.to(dtype) if torch_in else x.astype(dtype, copy=False)
        return xp.broadcast_to(x, full).reshape(shape)

    q = canon(rotated_q(call.q, call.k), (*p.batch, p.tq, p.d), (b, groups, p.tq, p.d))  # (B, G, Tq, D): G query heads per k/v head
    if call.request.quantized:  # dequantized one key block at a time, as the loop slices them
        k, v = Tiles(call.k, dtype, not torch_in), Tiles(call.v, dtype, not torch_in)  # (B, Tk, D), (B, Tk, Dv)
    else:
        k = canon(call.k, (*lead, p.tk, p.d), (b, p.tk, p.d))  # (B, Tk, D)
        v = canon(call.v, (*lead, p.tk, p.dv), (b, p.tk, p.dv))  # (B, Tk, Dv)

    def view(x: Any) -> Any:  # mask or bias as a (..., G, Tq, Tk) view, copied a tile at a time
        if x is None:
            return None
        if x.dtype != xp.bool:
            x = x.to(dtype) if torch_in else x.astype(dtype, copy=False)
        return xp.broadcast_to(x, (*p.batch, p.tq, p.tk)).reshape(*lead, groups, p.tq, p.tk)

    tiling = Tiling(p.tq, p.tk, call.visible, mask=view(call.visible.dense), bias=view(call.options.bias))
    sinks = None
    if call.options.sink_logits is not None:  # (B, G): each canonical query head's logit
        sk = call.options.sink_logits
        sk = sk.to(dtype) if torch_in else np.asarray(sk).astype(dtype)
        sinks = xp.broadcast_to(sk, p.batch).reshape(b, groups)
    return Canonical(q, k, v, tiling, torch_in, sinks)


@functools.cache
def autograd_function() -> type:
    """``BlockwiseFunction``, defined on first use so that importing attnlab does not import torch."""
    import torch

    class BlockwiseFunction(torch.autograd.Function):
        """out, LSE = forward(q, k, v) of canonical q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv)."""

        @staticmethod
        def forward(ctx, q, k, v, sinks, tiling, scale, block_size, forward, backward):  # noqa: ANN001, ANN205
            out, lse = forward(q, k, v, tiling, scale=scale, block_size=block_size, sinks=sinks)
            ctx.save_for_backward(q, k, v, out, lse, sinks)
            ctx.args = (tiling, scale, block_size, backward or online.backward)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):  # noqa: ANN001, ANN205
            q, k, v, out, lse, sinks = ctx.saved_tensors
            tiling, scale, block_size, backward = ctx.args
            dq, dk, dv = backward(q, k, v, out, lse, dout, dlse, tiling, scale=scale, block_size=block_size)
            dsinks = None if sinks is None else online.sink_grad(sinks, out, lse, dout, dlse)
            return dq, dk, dv, dsinks, None, None, None, None, None

    return BlockwiseFunction


def run_blockwise(call: Call, forward: Callable[..., tuple[Any, Any]],
                  backward: Callable[..., tuple[Any, Any, Any]] | None = None) -> tuple[Any, Any, Any]:
    """Run ``forward`` (a blockwise forward pass) on the call: out, rows of weights, LSE in the call's terms.

    ``backward``: its gradients (the signature of :func:`online.backward`, which is the default).
    """
    c, p = canonical(call), call.problem
    if call.request.grad:
        out, lse = autograd_function().apply(c.q, c.k, c.v, c.sinks, c.tiling, p.scale, call.options.block_size, forward,
                                             backward)
    else:
        out, lse = forward(c.q, c.k, c.v, c.tiling, scale=p.scale, block_size=_block_size(call), sinks=c.sinks)
    weights = None
    if call.rows is not None:
        if c.torch:  # a diagnostic: computed outside the graph
            import torch

            with torch.no_grad():
                weights = online.weights_rows(c.q, c.k, lse, c.tiling, call.rows, scale=p.scale)
        else:
            weights = online.weights_rows(c.q, c.k, lse, c.tiling, call.rows, scale=p.scale)
        weights = as_result(weights.reshape(*p.batch, len(call.rows), p.tk), p.dtype, c.torch)
    out = as_result(out.reshape(*p.batch, p.tq, p.dv), p.dtype, c.torch)  # (..., Tq, Dv)
    lse = as_result(lse.reshape(*p.batch, p.tq), p.dtype, c.torch) if call.request.lse else None
    return out, weights, lse


def _block_size(call: Call) -> Any:
    """The call's block size; for a decode step over a quantized cache, long key blocks (each is one dequantization)."""
    p = call.problem
    if call.options.block_size is None and call.request.quantized and p.tq * p.groups <= 64:
        return (p.tq, QUANTIZED_DECODE_KEYS)
    return call.options.block_size


def as_result(x: Any, dtype: str, torch_in: bool) -> Any:
    """A float32 result in the call's dtype and array library."""
    if torch_in:
        import torch

        want = getattr(torch, dtype)
        return x if x.dtype == want else x.to(want)  # (a decoding step's float32 result: no call at all)
    return x.astype(dtype, copy=False)


class BlockwiseBackend(Backend):
    name = "blockwise"
    summary = "online-softmax loop of NumPy or torch calls: O(T) memory, any mask, LSE, rows of weights, gradients"
    supports = Supports(
        libraries=frozenset({"numpy", "torch"}),
        devices="any",
        dtypes=frozenset(FLOAT_DTYPES),
        features=frozenset({"mask", "bias", "band", "structure", "lengths", "mask_mod", "score_mod", "alibi", "sinks", "gqa",
                            "weights_rows", "lse", "grad", "block_size", "kv_dtype", "softcap", "quantized"}),
        instead={"weights": "it never materialises (Tq, Tk); ask weights_rows= for the rows you need"},
    )

    def more_refusals(self, r: Request) -> list[str]:
        why = []
        if r.grad and r.score_mod:
            why.append("does not differentiate through a score_mod callable (torch does; masks.alibi is served with gradients)")
        if r.grad and r.quantized:
            why.append("does not differentiate through a quantized cache (codes have no gradient)")
        return why

    def compute_dtype(self, dtype: str) -> str:
        return work_dtype(dtype)

    def estimate(self, r: Request) -> float:
        extra = torch_overhead(r) if r.library == "torch" else 0.0
        return extra + PRIOR_OVERHEAD_S + max(PRIOR_NS_PER_SCORE * 1e-9 * r.scores * r.visible,
                                              read_seconds(r, 4, per_query_head=True))

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        return run_blockwise(call, online.forward)
