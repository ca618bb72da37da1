"""The ``sdpa`` backend: ``torch.nn.functional.scaled_dot_product_attention``, attnlab's conventions kept.

Translated faithfully: causal with Tq ≠ Tk is aligned bottom-right (SDPA's ``is_causal`` is
top-left), so that case, windows and key padding (with causal each sequence's own band: query i of
sequence b at lengths[b] − Tq + i) go in as an explicit mask; a row with nothing to
attend to gives zeros (SDPA's kernels differ on it); k/v with fewer heads use ``enable_gqa``.
Fused kernels keep no weights: SDPA refuses calls that ask for weights or the LSE.
"""

from __future__ import annotations

import math
from typing import Any

from attnlab.backends.base import Backend, Supports, as_torch, like_input, read_seconds, torch_overhead, torch_refusals
from attnlab.backends.request import Call, Request, dense_mask
from attnlab.reference.validate import FLOAT_DTYPES

# A rough prior for auto where nothing was measured. Why the masked figure is larger: with an
# explicit mask SDPA leaves its fused kernels and materialises (Tq, Tk).
PRIOR_NS_PER_SCORE = 1.8
PRIOR_NS_PER_SCORE_MASKED = 5.0
PRIOR_CAUSAL_FRACTION = 0.75
PRIOR_OVERHEAD_S = 3e-5


def _fast_causal(r: Request) -> bool:
    """SDPA's own is_causal fits: square, causal and nothing else."""
    return r.causal and r.band and r.problem.tq == r.problem.tk and not (r.mask or r.bias or r.structure or r.lengths)


def _is_plain_causal(call: Call) -> bool:
    return _fast_causal(call.request)


class SdpaBackend(Backend):
    name = "sdpa"
    summary = "torch.nn.functional.scaled_dot_product_attention: fused, gradients; no weights, no LSE"

    # Fused kernels keep no weights and no LSE (blockwise gives rows of weights and the LSE; torch all of them).
    supports = Supports(
        libraries=frozenset({"numpy", "torch"}),
        devices="any",
        dtypes=frozenset(FLOAT_DTYPES),
        features=frozenset({"mask", "bias", "band", "structure", "lengths", "gqa", "grad", "bias_grad"}),
        instead={f: "blockwise serves it in O(T) memory, torch materialises it" for f in ("mask_mod", "score_mod", "alibi", "sinks")}
        | {"quantized": "it reads float tensors; blockwise dequantizes a key block at a time"},
    )

    def more_refusals(self, r: Request) -> list[str]:
        return torch_refusals(r)

    def compute_dtype(self, dtype: str) -> str:
        # float16/bfloat16: SDPA's fused kernels accumulate in float32 (its math path on the CPU does too)
        return "float32" if dtype in ("float16", "bfloat16") else dtype

    def estimate(self, r: Request) -> float:
        ns = PRIOR_NS_PER_SCORE
        if r.mask or r.bias or r.structure or r.lengths or (r.band and not _fast_causal(r)):
            ns = PRIOR_NS_PER_SCORE_MASKED
        elif r.band:  # causal: a fraction of the scores
            ns *= PRIOR_CAUSAL_FRACTION
        return torch_overhead(r) + PRIOR_OVERHEAD_S + max(ns * 1e-9 * r.scores, read_seconds(r, 4, per_query_head=True))

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        import torch
        import torch.nn.functional as F

        q, k, v, bias = (as_torch(x) for x in (call.q, call.k, call.v, call.options.bias))
        batch = call.problem.batch
        gqa = call.problem.groups > 1
        kv_batch = (*batch[:-1], k.shape[-3]) if gqa else batch
        q = _four(q.expand(*batch, *q.shape[-2:]))  # (B, H, Tq, D)
        k, v = _four(k.expand(*kv_batch, *k.shape[-2:])), _four(v.expand(*kv_batch, *v.shape[-2:]))
        if _is_plain_causal(call):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=call.problem.scale, enable_gqa=gqa)
            return like_input(out.reshape(*batch, *out.shape[-2:]), call), None, None
        allowed = dense_mask(call)
        allowed = None if allowed is None else _mask4(as_torch(allowed).to(q.device), batch)
        bias = None if bias is None else _mask4(bias, batch)
        attn_mask, dead = allowed, None
        if bias is not None:
            attn_mask = bias.to(q.dtype)
            if allowed is not None:
                attn_mask = attn_mask.masked_fill(~allowed, -math.inf)
            dead = torch.isneginf(attn_mask).all(dim=-1)  # (..., Tq)
        elif allowed is not None:
            dead = ~allowed.any(dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=call.problem.scale, enable_gqa=gqa)
        if dead is not None and bool(dead.any()):
            out = out.masked_fill(dead.expand(out.shape[:-1])[..., None], 0.0)
        return like_input(out.reshape(*batch, *out.shape[-2:]), call), None, None


def _four(x: Any) -> Any:
    """(..., T, D) → (B, H, T, D): SDPA's fused CPU kernels take 4-D inputs (3-D ones fall to the O(T²) math path)."""
    lead = x.shape[:-2]
    if len(lead) >= 2:
        return x.reshape(-1, lead[-1], *x.shape[-2:])  # (B, H, T, D)
    return x.reshape(1, lead[0] if lead else 1, *x.shape[-2:])  # (1, H or 1, T, D)


def _mask4(m: Any, batch: tuple) -> Any:
    """A mask or bias broadcastable to (*batch, Tq, Tk), shaped to broadcast against the 4-D scores."""
    if all(s == 1 for s in m.shape[:-2]):
        return m.reshape(m.shape[-2:])  # (Tq or 1, Tk): broadcasts as it is, no copy
    return _four(m.expand(*batch, *m.shape[-2:]))  # (B, H, Tq or 1, Tk)
