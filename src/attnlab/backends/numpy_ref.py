"""The ``numpy`` backend: the float64 reference, the specification itself."""

from __future__ import annotations

from typing import Any

from attnlab.backends.base import Backend, Supports, read_seconds
from attnlab.backends.request import Call, Request, repeat_groups
from attnlab.reference import attention as reference

# A rough prior for auto where nothing was measured: float64 matmuls + exp + softmax per score.
PRIOR_NS_PER_SCORE = 10.0
PRIOR_OVERHEAD_S = 2e-5


class NumpyBackend(Backend):
    name = "numpy"
    summary = "float64 NumPy reference (the spec): every mask, weights; NumPy in, no LSE, no gradients"
    supports = Supports(
        libraries=frozenset({"numpy"}),
        devices="cpu",
        dtypes=frozenset({"float16", "float32", "float64"}),
        features=frozenset({"mask", "bias", "band", "structure", "lengths", "mask_mod", "score_mod", "alibi", "sinks", "gqa",
                            "weights", "weights_rows", "softcap", "quantized"}),
    )

    def compute_dtype(self, dtype: str) -> str:
        return "float64"  # the reference computes in float64 and returns the inputs' dtype

    def estimate(self, r: Request) -> float:
        return PRIOR_OVERHEAD_S + max(PRIOR_NS_PER_SCORE * 1e-9 * r.scores, read_seconds(r, 8, per_query_head=True))

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        g, k, v = call.problem.groups, call.k, call.v
        if call.request.quantized:  # the float64 reference on the dequantized keys and values (original basis)
            k, v = k.reference(), v.reference()
        k, v = repeat_groups(k, g), repeat_groups(v, g)
        want = call.request.weights or call.request.weights_rows
        o = call.options
        res = reference.attention(call.q, k, v, mask=o.mask, causal=o.causal, window=o.window, lengths=o.lengths,
                                  bias=o.bias, score_mod=o.score_mod, sink_logits=o.sink_logits, scale=call.problem.scale,
                                  return_weights=want, softcap=o.softcap)
        res = (res,) if not want else res
        out, *w = (x.astype(call.problem.dtype, copy=False) for x in res)  # q's dtype (quantized: k, v were float64)
        if not want:
            return out, None, None
        return out, (w[0] if call.rows is None else w[0][..., call.rows, :]), None
