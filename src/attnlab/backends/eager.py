"""The ``torch`` backend: the reference's math in PyTorch eager, differentiable, on any device.

It materialises the (..., Tq, Tk) scores, so it can hand back every weight and the LSE; it
computes in the inputs' dtype (it is "plain torch", the yardstick for float16/bfloat16 errors). A quantized
cache's keys and values are dequantized a tile of keys at a time (never a full float copy of them).
"""

from __future__ import annotations

import math
from typing import Any

from attnlab.backends.base import Backend, Supports, as_torch, like_input, read_seconds, torch_overhead, torch_refusals
from attnlab.backends.quantized import rotated_q
from attnlab.backends.request import Call, Request, dense_mask, repeat_groups
from attnlab.masks.frame import split_batch
from attnlab.reference.quantized import QuantizedKV
from attnlab.reference.validate import FLOAT_DTYPES

# A rough prior for auto where nothing was measured: matmul + softmax + matmul per score.
PRIOR_NS_PER_SCORE = 7.5
PRIOR_OVERHEAD_S = 5e-5


class TorchBackend(Backend):
    name = "torch"
    summary = "PyTorch eager, materialises the scores: every mask, weights, LSE, gradients, any device"

    supports = Supports(
        libraries=frozenset({"numpy", "torch"}),
        devices="any",
        dtypes=frozenset(FLOAT_DTYPES),
        features=frozenset({"mask", "bias", "band", "structure", "lengths", "mask_mod", "score_mod", "alibi", "sinks", "gqa",
                            "weights", "weights_rows", "lse", "grad", "bias_grad", "softcap", "kv_dtype", "quantized"}),
    )

    def more_refusals(self, r: Request) -> list[str]:
        if r.grad and r.quantized:
            return [*torch_refusals(r), "does not differentiate through a quantized cache (codes have no gradient)"]
        return torch_refusals(r)

    def estimate(self, r: Request) -> float:
        return torch_overhead(r) + PRIOR_OVERHEAD_S + max(PRIOR_NS_PER_SCORE * 1e-9 * r.scores,
                                                            read_seconds(r, 4, per_query_head=True))

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        q, k, v = (x if isinstance(x, QuantizedKV) else as_torch(x) for x in (call.q, call.k, call.v))
        w, s = eager_weights(q, k, v, call)
        if isinstance(v, QuantizedKV):  # a quantized cache: its values dequantized a tile at a time
            out = weighted_values(w, v, call.problem.groups)
        else:
            out = w.matmul(repeat_groups(v.to(q.dtype), call.problem.groups))  # (..., Tq, Dv)
        weights = None
        if call.request.weights:
            weights = w
        elif call.rows is not None:
            import torch

            weights = w[..., torch.from_numpy(call.rows).to(w.device), :]
        lse = logsumexp(s, call) if call.request.lse else None
        return like_input(out, call), like_input(weights, call), like_input(lse, call)


def eager_scores(q: Any, k: Any, call: Call) -> Any:
    """The scores (..., Tq, Tk) as the softmax takes them: scale, softcap, bias, score_mod, then −inf
    where the call's visibility hides a pair (torch tensors; k in q's dtype)."""
    import torch

    if isinstance(k, QuantizedKV):  # a quantized cache: its keys dequantized a tile at a time
        s = key_products(q, k, call.problem.groups) * call.problem.scale  # (B, H, Tq, Tk)
    else:
        k = repeat_groups(k.to(q.dtype), call.problem.groups)  # a 16-bit cache: q's dtype
        s = torch.matmul(q, k.transpose(-1, -2)) * call.problem.scale  # (..., Tq, Tk)
    o, seen = call.options, call.visible
    if o.softcap is not None:
        s = torch.tanh(s / o.softcap) * o.softcap
    if o.bias is not None:
        s = s + as_torch(o.bias).to(s.dtype)
    if seen.score_mod is not None:
        f = seen.frame
        changed = seen.score_mod(f, s.reshape(*split_batch(f.batch), f.tq, f.tk), *f.grid())
        s = changed.reshape(s.shape).to(s.dtype)  # a callable's constants may promote: the scores keep their dtype
    allowed = dense_mask(call)
    if allowed is not None:
        s = s.masked_fill(~as_torch(allowed).to(s.device), -math.inf)
    return s


def eager_weights(q: Any, k: Any, v: Any, call: Call, scores: Any = None) -> tuple[Any, Any]:
    """(weights, scores): the softmax of :func:`eager_scores` (or of ``scores`` given), over the
    learned sinks too where the call has them; a row with nothing to attend to gets zeros."""
    import torch

    s = eager_scores(q, k, call) if scores is None else scores
    sinks = call.options.sink_logits
    if sinks is None:
        return torch.softmax(s, dim=-1).nan_to_num(nan=0.0), s
    sink = as_torch(sinks).to(s.dtype)
    sink = sink.reshape(*sink.shape, 1, 1).expand(*s.shape[:-1], 1)  # (..., Tq, 1)
    w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]  # the sink's own weight left out
    return w, s


def logsumexp(s: Any, call: Call) -> Any:
    """Each row's log-sum-exp, over its sink logit too."""
    import torch

    sinks = call.options.sink_logits
    if sinks is None:
        return torch.logsumexp(s, dim=-1)
    sink = as_torch(sinks).to(s.dtype)
    return torch.logaddexp(torch.logsumexp(s, dim=-1), sink.reshape(*sink.shape, 1).expand(s.shape[:-1]))


TORCH_TILE = 4096  # keys per tile when the torch backend reads a quantized cache


def key_products(q: Any, k: QuantizedKV, groups: int) -> Any:
    """q·kᵀ (B, H, Tq, Tk) over a quantized cache's keys, dequantized a tile of keys at a time (q turned by the
    keys' rotation; each tile in q's dtype, repeated to the query heads that share it)."""
    import torch

    q = rotated_q(q, k)
    tiles = [q @ repeat_groups(k.dequantize(a, min(a + TORCH_TILE, k.length)).to(q.dtype), groups).transpose(-1, -2)
             for a in range(0, k.length, TORCH_TILE)]  # (B, H, Tq, tile) each
    return torch.cat(tiles, dim=-1)


def weighted_values(w: Any, v: QuantizedKV, groups: int) -> Any:
    """w·v (B, H, Tq, Dv) for weights w (B, H, Tq, Tk) over a quantized cache's values, a tile at a time."""
    out = None
    for a in range(0, v.length, TORCH_TILE):
        b = min(a + TORCH_TILE, v.length)
        part = w[..., a:b] @ repeat_groups(v.dequantize(a, b).to(w.dtype), groups)  # (B, H, Tq, Dv)
        out = part if out is None else out + part
    return out
