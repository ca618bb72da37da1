"""One forward pass as each layer of attnlab's transformer sees it (:class:`Pass`, the frozen per-call
description), and how a layer computes its attention with it: one :func:`attnlab.attention` call, whose
keywords :meth:`Pass.visibility` (a plain pass) or the cache's read (decoding) say once. Where the scores
or the pattern are hooked, :func:`attend_eager` runs the torch backend's own math (its functions, in its
order) with the hooks between, so that watching changes no bit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnlab import masks
from attnlab.backends.api import attention, attention_read
from attnlab.backends.eager import eager_scores, eager_weights, weighted_values
from attnlab.backends.options import Options
from attnlab.backends.reads import Reads
from attnlab.backends.request import prepare, repeat_groups
from attnlab.reference.quantized import QuantizedKV
from attnlab.transformer.cache import KVCache
from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.hooks import Hooks
from attnlab.transformer.layer_cache import Step


@dataclass(frozen=True)
class Pass:
    """One forward pass as every layer sees it."""

    config: TransformerConfig
    backend: str
    causal: bool
    positions: Any  # (T,) or (B, T) position of each token
    hooks: Hooks
    lengths: Any = None  # (B,) real tokens when padding is on the right, else None
    key_mask: Any = None  # (B, 1, 1, T) bool when the padding is elsewhere, else None
    documents: Any = None  # (B, T) or (T,) document ids of a packed batch, else None
    rope: Any = None  # rotary cos and sin of the positions, (T, Dh) or (B, 1, T, Dh) each
    rope_local: Any = None  # the same for the layers with their own local base (Gemma-3's sliding ones), else None
    kv: KVCache | None = None  # decoding: the cache the new tokens are appended to ...
    step: Step | None = None  # ... and what this call appends
    reads: Reads | None = None  # a generation's reads of that cache (choices and direct calls kept), else None

    def visibility(self, window: masks.Mask | None) -> dict:
        """attention()'s keywords for a layer of the plain pass with its sliding window (a Mask, or None):
        causal, the window, packed documents, key padding (right: key lengths; else a mask)."""
        terms = [] if window is None else [window]
        if self.documents is not None:
            terms.append(masks.documents(self.documents.cpu().numpy()))
        if self.lengths is not None:
            terms.append(masks.key_lengths(self.lengths.cpu().numpy()))
        if self.key_mask is not None:
            terms.append(masks.as_mask(self.key_mask))
        mask = None
        for t in terms:
            mask = t if mask is None else mask & t
        return {"causal": self.causal, "mask": mask}


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass, kw: dict, last: bool = False,
           slot: Any = None) -> tuple:
    """attnlab.attention on torch tensors (the float64 NumPy reference gets NumPy copies, no gradients):
    z (B, H, Tq, Dh) and, with ``last``, the newest query's weights (B, H, Tk) (recomputed from the LSE).
    A generation's read of its cache by the layer ``slot`` goes through the pass's :class:`Reads`; a decoding
    step's row over a plain read is computed directly (:func:`_decode_row`), beside that read."""
    row = _decode_row(q, k, p, kw).to(q.dtype) if last and _plain_row(q, k, p, kw) else None
    kw = _call_kwargs(p, kw)
    if last and row is None:
        kw["weights_rows"] = [q.shape[2] - 1]
    if p.backend == "numpy":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError("backend 'numpy' computes on float64 NumPy copies, without gradients; run under "
                             "torch.no_grad() or choose a backend with gradients (torch, blockwise, kernel)")
        # a quantized cache's k and v go as they are: the reference dequantizes them in float64
        arrays = [t if isinstance(t, QuantizedKV) else t.detach().cpu().double().numpy() for t in (q, k, v)]
        kw = {n: (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
        out = attention(*arrays, backend="numpy", **kw)
        out = [torch.from_numpy(o).to(device=q.device, dtype=q.dtype) for o in (out if isinstance(out, tuple) else (out,))]
    elif p.reads is not None and slot is not None and (not last or row is not None):  # what stays fixed kept per layer
        return p.reads(slot, q, k, v, kw), row
    elif p.kv is not None and (kw.get("kv_checked") or isinstance(k, QuantizedKV)):  # a read of the cache, which
        # checked its keys (or holds them as codes): no second check
        out = list(attention_read(q, k, v, Options.of(kw), p.backend))
    else:
        out = attention(q, k, v, backend=p.backend, **kw)
        out = list(out) if isinstance(out, tuple) else [out]
    return out[0], (row if row is not None else out[1][:, :, 0] if last else out[1] if len(out) > 1 else None)


def received(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass, kw: dict, rows: range,
             chunk: int = 128, row: torch.Tensor | None = None) -> torch.Tensor:
    """The weights the query columns ``rows`` of this step give each key, summed over them: (B, H, Tk) float32
    or wider. Each chunk of rows is one attention call (``weights_rows=``) over the keys its newest row may
    see (bottom-right causal with each sequence's length cut to it), so nothing holds Tq × Tk. A decoding
    step's one row over a plain read (:func:`_plain_row`) is the softmax computed directly (:func:`_decode_row`),
    or ``row``, the same call's row as :func:`attend` returned it (``last=True``: computed the same way), where
    that kept it in float32 or wider: with ``generate(maps=True)`` it is not computed twice."""
    if rows == range(1) and _plain_row(q, k, p, kw):
        wide = torch.promote_types(q.dtype, torch.float32)
        return row if row is not None and row.dtype == wide else _decode_row(q, k, p, kw)
    B, H, tq, _ = q.shape
    full = kw.get("lengths")
    n = torch.full((B,), k.shape[2], device=q.device) if full is None else torch.as_tensor(full, device=q.device)
    total = q.new_zeros(B, H, k.shape[2], dtype=torch.promote_types(q.dtype, torch.float32))
    for i in range(rows.start, rows.stop, chunk):
        j = min(i + chunk, rows.stop)
        cut = dict(kw, lengths=(n - (tq - j)).clamp(min=0), weights_rows=list(range(j - i)))  # (B,) keys row j − 1 sees
        total += attend(q[:, :, i:j], k, v, p, cut)[1].sum(2)  # (B, H, R, Tk) → (B, H, Tk)
    return total


# what the keywords of a read whose row _decode_row computes may hold (the mask only as None)
ROW_KEYWORDS = frozenset({"causal", "lengths", "mask", "kv_checked", "k_norm"})


def _plain_row(q: torch.Tensor, k: Any, p: Pass, kw: dict) -> bool:
    """One query row per head over every key of its sequence (each ``lengths[b]``, else all) held as tensors,
    causal, with the model's scale and nothing else said (no mask, softcap, sinks): what a plain decoding read of
    a dense or evicting cache is. A quantized cache's row goes the general way, where the kernel's decode pass
    writes its scores as it reads the codes; the numpy backend (the reference) keeps its own path."""
    lengths = kw.get("lengths")
    return (q.shape[2] == 1 and isinstance(k, torch.Tensor) and p.backend != "numpy"
            and ROW_KEYWORDS.issuperset(kw) and kw.get("causal") is True and kw.get("mask") is None
            and p.config.attn_softcap is None and (lengths is None or tuple(lengths.shape) == (q.shape[0],)))


def _decode_row(q: torch.Tensor, k: torch.Tensor, p: Pass, kw: dict) -> torch.Tensor:
    """The weights (B, H, Tk) of a decoding step's one query row per head over a plain read: softmax(scale · q kᵀ)
    over each sequence's keys [0, lengths[b]) (zeros past them and for a sequence with none), query head h
    reading k/v head h // (H / H_kv). The same weights as the general path's ``weights_rows=`` call to float
    rounding, without preparing a call (decoder-long, 1,536 prompt tokens, one thread: 1.5 ms a layer and step →
    tens of µs)."""
    B, H, _, d = q.shape
    hk, tk = k.shape[1], k.shape[2]
    dtype = torch.promote_types(q.dtype, torch.float32)
    scale = p.config.attn_scale if p.config.attn_scale is not None else d ** -0.5
    with torch.no_grad():
        s = torch.matmul(q.detach().to(dtype).reshape(B, hk, H // hk, d), k.detach().to(dtype).transpose(-1, -2))
        s = s.reshape(B, H, tk) * scale
        lengths = kw.get("lengths")
        if lengths is None:
            return torch.softmax(s, dim=-1)
        seen = torch.arange(tk, device=s.device) < lengths.to(s.device)[:, None, None]  # (B, 1, Tk)
        w = torch.softmax(s.masked_fill(~seen, -torch.inf), dim=-1)
        return w.masked_fill(~seen, 0.0)  # a sequence with no keys: zeros, not NaN


def attend_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass, at: str, kw: dict,
                 last: bool = False) -> tuple:
    """The torch backend's math with ``hook_attn_scores`` (after scale, softcap, score changes and masks,
    before the softmax) and ``hook_pattern`` between its steps, the scores and weights (B, H, Tq, Tk); z = pattern · v.
    Without replacing hooks this is bit for bit ``attend`` with backend "torch". Decoding: the cache's keys (a
    quantized cache's read a tile at a time, as the torch backend reads them)."""
    call = prepare(q, k, v, Options.of(_call_kwargs(p, kw)))
    s = p.hooks(at + "hook_attn_scores", eager_scores(q, k, call))
    w, _ = eager_weights(q, k, v, call, scores=s)
    w = p.hooks(at + "hook_pattern", w)
    if isinstance(v, QuantizedKV):
        z = weighted_values(w, v, call.problem.groups)  # (B, H, Tq, Dh)
    else:
        z = w.matmul(repeat_groups(v.to(q.dtype), call.problem.groups))  # (B, H, Tq, Dh)
    return z, (w[:, :, -1] if last else None)


def _call_kwargs(p: Pass, kw: dict) -> dict:
    """A layer's attention keywords with the model's scale and softcap."""
    c = p.config
    return dict(kw, scale=c.attn_scale, softcap=c.attn_softcap)
