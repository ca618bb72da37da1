"""The ``numpy`` backend: the float64 reference, the specification itself."""

from __future__ import annotations

from typing import Any

from attnlab.attention import reference
from attnlab.attention._calls import Backend, Call, Request, dense_mask, repeat_groups

NS_PER_SCORE = 10.0  # float64 matmuls + exp + softmax in NumPy, per query-key pair (2-core CPU)
OVERHEAD_S = 2e-5


class NumpyBackend(Backend):
    name = "numpy"
    summary = "float64 NumPy reference (the spec): every mask, weights; NumPy in, no LSE, no gradients"

    def refuse(self, r: Request) -> str | None:
        if r.kind != "numpy":
            return "takes NumPy arrays, got torch tensors"
        if r.lse:
            return "returns no LSE (use blockwise or torch)"
        return None

    def cost(self, r: Request) -> float:
        return OVERHEAD_S + NS_PER_SCORE * 1e-9 * r.scores

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        g = call.problem.groups
        k, v = repeat_groups(call.k, g), repeat_groups(call.v, g)
        want = call.request.weights or call.request.weights_rows
        res = reference.attention(call.q, k, v, mask=dense_mask(call), bias=call.bias, scale=call.problem.scale, return_weights=want)
        if not want:
            return res, None, None
        out, w = res
        return out, (w if call.rows is None else w[..., call.rows, :]), None
