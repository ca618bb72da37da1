"""The ``blockwise`` backend: attnlab's online-softmax kernel (NumPy in, NumPy kernel; torch in, torch kernel).

It never materialises (Tq, Tk): weights only for chosen rows (``weights_rows=``), recomputed from
the LSE. In torch it is differentiable through :class:`BlockwiseFunction`, FlashAttention-2's
backward, which recomputes the tiles from q, k, v, the output and the LSE instead of storing them.
Low-precision inputs are computed in float32 and returned in their dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from attnlab.attention import blockwise, tiles
from attnlab.attention._calls import Backend, Call, Request

# Per visited query-key pair, forward, 2-core CPU (benchmarks/README.md); only the tiles a band
# leaves are visited. The compiled kernel (float32 on the CPU, no dense mask or bias): 1.4-1.5 ns,
# against sdpa's 1.8 (causal: about 1.0 per pair of the whole square). The Python loop: torch
# 1.9-2.6 ns, NumPy 2.2-3 ns, kept at 2.8, as sdpa measured 1.1-1.3x faster than it on plain calls.
NS_PER_SCORE_COMPILED = 1.5
OVERHEAD_COMPILED_S = 5e-5
NS_PER_SCORE_LOOP = 2.8
OVERHEAD_LOOP_S = 2e-4  # the Python loop over tiles


@functools.cache
def autograd_function() -> type:
    """``BlockwiseFunction``, defined on first use so that importing attnlab does not import torch."""
    import torch

    class BlockwiseFunction(torch.autograd.Function):
        """out, LSE = blockwise attention of canonical q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv)."""

        @staticmethod
        def forward(ctx, q, k, v, tiling, scale, block_size):  # noqa: ANN001, ANN205
            out, lse = blockwise.forward(q, k, v, tiling, scale=scale, block_size=block_size)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.args = (tiling, scale, block_size)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):  # noqa: ANN001, ANN205
            q, k, v, out, lse = ctx.saved_tensors
            tiling, scale, block_size = ctx.args
            dq, dk, dv = blockwise.backward(q, k, v, out, lse, dout, dlse, tiling, scale=scale, block_size=block_size)
            return dq, dk, dv, None, None, None

    return BlockwiseFunction


class BlockwiseBackend(Backend):
    name = "blockwise"
    summary = "online-softmax tiles (NumPy or torch): O(T) memory, skips masked tiles, LSE, rows of weights, gradients"

    def refuse(self, r: Request) -> str | None:
        if r.weights:
            return "never materialises (Tq, Tk); ask weights_rows= for the rows you need"
        if r.bias_grad:
            return "computes no gradient for bias (use torch or sdpa)"
        return None

    def cost(self, r: Request) -> float:
        from attnlab.attention._calls import torch_overhead

        work = "float32" if r.dtype in ("float16", "bfloat16") else r.dtype  # what run() computes in
        if tiles.refusal(r.device, work, r.mask or r.bias) is None:
            overhead, ns = OVERHEAD_COMPILED_S, NS_PER_SCORE_COMPILED
        else:
            overhead, ns = OVERHEAD_LOOP_S, NS_PER_SCORE_LOOP
        extra = torch_overhead(r) if r.kind == "torch" else 0.0
        return extra + overhead + ns * 1e-9 * r.scores * r.visible

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        p, torch_in = call.problem, call.request.kind == "torch"
        xp = np
        if torch_in:
            import torch as xp
        work = "float32" if p.dtype in ("float16", "bfloat16") else p.dtype  # float32 accumulators at least
        dtype = getattr(xp, work)
        groups = p.groups
        lead = (*p.batch[:-1], call.k.shape[-3]) if groups > 1 else p.batch  # key/value batch dims
        b = int(np.prod(lead, dtype=np.int64))

        def canon(x: Any, full: tuple, shape: tuple) -> Any:  # broadcast to `full`, then reshape
            x = x.to(dtype) if torch_in else x.astype(dtype, copy=False)
            return xp.broadcast_to(x, full).reshape(shape)

        q = canon(call.q, (*p.batch, p.tq, p.d), (b, groups, p.tq, p.d))  # (B, G, Tq, D): G query heads per k/v head
        k = canon(call.k, (*lead, p.tk, p.d), (b, p.tk, p.d))  # (B, Tk, D)
        v = canon(call.v, (*lead, p.tk, p.dv), (b, p.tk, p.dv))  # (B, Tk, Dv)

        def view(x: Any) -> Any:  # mask or bias as a (..., G, Tq, Tk) view, copied a tile at a time
            if x is None:
                return None
            if x.dtype != xp.bool:
                x = x.to(dtype) if torch_in else x.astype(dtype, copy=False)
            return xp.broadcast_to(x, (*p.batch, p.tq, p.tk)).reshape(*lead, groups, p.tq, p.tk)

        klen = None
        if call.klen is not None:
            klen = call.klen.reshape(b, groups)  # (B, G)
            klen = xp.from_numpy(np.array(klen)).to(q.device) if torch_in else klen
        tiling = blockwise.Tiling(p.tq, p.tk, call.left, call.right, klen=klen, mask=view(call.mask), bias=view(call.bias))
        if call.request.grad:
            out, lse = autograd_function().apply(q, k, v, tiling, p.scale, call.block_size)
        else:
            out, lse = blockwise.forward(q, k, v, tiling, scale=p.scale, block_size=call.block_size)
        weights = None
        if call.rows is not None:
            if torch_in:  # a diagnostic: computed outside the graph
                with xp.no_grad():
                    weights = blockwise.weights_rows(q, k, lse, tiling, call.rows, scale=p.scale)
            else:
                weights = blockwise.weights_rows(q, k, lse, tiling, call.rows, scale=p.scale)
            weights = _result(weights.reshape(*p.batch, len(call.rows), p.tk), p.dtype, torch_in)
        out = _result(out.reshape(*p.batch, p.tq, p.dv), p.dtype, torch_in)  # (..., Tq, Dv)
        lse = _result(lse.reshape(*p.batch, p.tq), p.dtype, torch_in) if call.request.lse else None
        return out, weights, lse


def _result(x: Any, dtype: str, torch_in: bool) -> Any:
    if torch_in:
        import torch

        return x.to(getattr(torch, dtype))
    return x.astype(dtype, copy=False)
