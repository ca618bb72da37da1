"""The ``torch`` backend: the reference's math in PyTorch eager, differentiable, on any device.

It materialises the (..., Tq, Tk) scores, so it can hand back every weight and the LSE; it
computes in the inputs' dtype (it is "plain torch", the yardstick for float16/bfloat16 errors).
"""

from __future__ import annotations

import math
from typing import Any

from attnlab.backends.base import Backend, Supports, as_torch, like_input, torch_overhead, torch_refusals
from attnlab.backends.request import Call, Request, dense_mask, repeat_groups
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
        features=frozenset({"mask", "bias", "band", "lengths", "gqa", "weights", "weights_rows", "lse", "grad", "bias_grad",
                            "softcap", "kv_dtype"}),
    )

    def more_refusals(self, r: Request) -> list[str]:
        return torch_refusals(r)

    def estimate(self, r: Request) -> float:
        return torch_overhead(r) + PRIOR_OVERHEAD_S + PRIOR_NS_PER_SCORE * 1e-9 * r.scores

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        import torch

        q, k, v, bias = (as_torch(x) for x in (call.q, call.k, call.v, call.options.bias))
        g = call.problem.groups
        k, v = repeat_groups(k.to(q.dtype), g), repeat_groups(v.to(q.dtype), g)  # a 16-bit cache: q's dtype
        s = torch.matmul(q, k.transpose(-1, -2)) * call.problem.scale  # (..., Tq, Tk)
        if call.options.softcap is not None:
            s = torch.tanh(s / call.options.softcap) * call.options.softcap
        if bias is not None:
            s = s + bias.to(s.dtype)
        allowed = dense_mask(call)
        if allowed is not None:
            s = s.masked_fill(~as_torch(allowed).to(s.device), -math.inf)
        w = torch.softmax(s, dim=-1).nan_to_num(nan=0.0)  # a row with nothing allowed is all NaN: zeros
        out = torch.matmul(w, v)  # (..., Tq, Dv)
        weights = None
        if call.request.weights:
            weights = w
        elif call.rows is not None:
            weights = w[..., torch.from_numpy(call.rows).to(w.device), :]
        lse = torch.logsumexp(s, dim=-1) if call.request.lse else None
        return like_input(out, call), like_input(weights, call), like_input(lse, call)
