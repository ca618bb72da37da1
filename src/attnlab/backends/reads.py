"""A generation's reads of its KV cache: :func:`attnlab.backends.api.attention_read` step after step, with
what does not change between steps worked out once.

A decoding step over a long cache is a read of memory, and that read evicts everything else from the CPU's
caches: the next step's Python (checks, auto's choice, the backend's wrapper) runs cold, at several hundred
microseconds per layer (``benchmarks/README.md`` measures it). :class:`Reads` keeps, per slot (a layer)
and length bucket, what auto chose for a plain read (one query row per head, every key of its sequence seen,
a ragged batch's rows by their lengths, keys checked when written) and, where that is the kernel's decode
pass or SDPA, calls it directly while the score bound
(q's largest norm times the cache's largest key length) is below any backend's overflow refusal: the
same call with the same inputs, so the same bits. Anything else goes through ``attention_read`` as before.
A quantized cache's plain read (its codes finite by construction, their bound stored) calls
:func:`kernel.decode` directly the same way, where auto chose the kernel. Internal to the transformer's
decoding (and the decode benchmark, which times what ``generate`` calls).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.backends import kernel
from attnlab.backends.api import attention, attention_read
from attnlab.backends.blockwise import as_result
from attnlab.backends.dispatch import BACKENDS, bucket, choose
from attnlab.backends.options import Options
from attnlab.backends.quantized import rotated_q
from attnlab.backends.request import CHEAP_BOUND_OK, Call, checked_bound, prepare_read
from attnlab.reference.quantized import QuantizedKV

# what a plain read's keywords may hold (read.kwargs() and the model's own): anything else takes attention_read
PLAIN = {"mask": None, "softcap": None}
KNOWN = frozenset(PLAIN) | {"causal", "lengths", "kv_checked", "k_norm", "scale", "sink_logits"}


class Reads:
    """``reads(slot, q, k, v, kw)`` → the attention output (B, H, Tq, Dv) of a cache's read (torch tensors),
    as ``attention_read(q, k, v, Options.of(kw), backend)[0]`` computes it (``attention(q, k, v, backend=,
    **kw)`` where ``kw`` does not say the keys were checked); ``slot`` names the caller's layer (its choice
    and its prepared call are its own)."""

    def __init__(self, backend: str = "auto"):
        self.backend = backend
        self.kept: dict[tuple, Any] = {}  # (slot, length bucket) → (backend name, its direct call or None)

    def __call__(self, slot: Any, q: Any, k: Any, v: Any, kw: dict) -> Any:
        if not _plain(q, k, kw):
            if not kw.get("kv_checked") and not isinstance(k, QuantizedKV):  # keys the cache did not check
                return attention(q, k, v, backend=self.backend, **kw)  # (a lossy read): attention()'s own checks
            return attention_read(q, k, v, Options.of(kw), self.backend)[0]
        lengths = kw.get("lengths")  # a ragged batch's: each row sees its sequence's keys [0, lengths[b])
        key = (slot, bucket(k.shape[2]), lengths is None)
        name, direct = self.kept.get(key, (None, None))
        if direct is not None and kw.get("sink_logits") is direct.sinks:
            out = direct(q, k, v, k.norm if isinstance(k, QuantizedKV) else kw["k_norm"], lengths)  # None: large bound
            if out is not None:
                return out
        call = prepare_read(q, k, v, Options.of(kw))  # attention_read's steps, the choice kept per bucket
        served = None if name is None else BACKENDS[name]
        if served is None or served.refusals(call.request):  # refused for this very call alone: auto's next choice
            served = choose(call.request, self.backend)
            if name is None and call.request.score_bound <= CHEAP_BOUND_OK:
                self.kept[key] = (served.name, _direct(served.name, call))
        return served.run(call)[0]


def _plain(q: Any, k: Any, kw: dict) -> bool:
    """One query row per head over every key of its sequence (all of them, or each sequence's ``lengths``) of a
    cache that checked them (or holds them as codes, finite by construction, with their bound), causal, nothing
    else said."""
    checked = kw.get("kv_checked") is True and kw.get("k_norm") is not None and hasattr(k, "stride")
    lengths = kw.get("lengths")
    return ((checked or isinstance(k, QuantizedKV)) and q.ndim == 4 and q.shape[2] == 1 and kw.get("causal") is True
            and (lengths is None or (hasattr(lengths, "stride") and tuple(lengths.shape) == (q.shape[0],)))
            and all(kw.get(n) is None for n in PLAIN) and KNOWN.issuperset(kw))


def _direct(name: str, call: Call) -> Any:
    """The chosen backend's own call for this bucket's plain reads, or None (it runs through its ``run``)."""
    r, ragged = call.request, call.options.lengths is not None
    if name == "kernel" and kernel._decodes(call) and (call.visible.spans is None or ragged and not r.quantized):
        return _QuantizedRead(call) if r.quantized else _KernelRead(call)
    if name == "sdpa" and not r.sinks and r.dtype == call.problem.kv_dtype and not ragged:
        return _SdpaRead(call)
    return None


def _q32(q: Any) -> np.ndarray:
    """q (torch) as the kernel reads it: float32, C-contiguous (a view where it is one already)."""
    import torch

    x = q.detach()
    return x.numpy() if x.dtype == torch.float32 and x.is_contiguous() else kernel._buffers(x)[0]


def _cheap(q32: np.ndarray, scale: float, k_norm: float) -> bool:
    """request.checked_bound(q, None, scale, k_norm) <= CHEAP_BOUND_OK, q's norm by the kernel (no torch call:
    33-50 µs cold); False for a q that is not finite."""
    return abs(scale) * kernel._tiles.max_norm(q32) * k_norm <= CHEAP_BOUND_OK


class _KernelRead:
    """The decode pass on a plain read: ``_tiles.decode`` as :func:`kernel.decode` calls it (no visibility
    but the sinks, q read as float32, k and v as stored), the result in q's dtype."""

    def __init__(self, call: Call):
        p = call.problem
        self.scale, self.stored, self.dtype = p.scale, p.kv_dtype, p.dtype
        self.sinks, self.kw = call.options.sink_logits, {}  # the layer's own logits: kept as decode passes them
        if self.sinks is not None:
            sinks = np.broadcast_to(kernel._f32(call.visible.sinks), p.batch[:2])
            self.kw = {"sinks": kernel.vis_args(call.visible, sinks)["sinks"]}

    def __call__(self, q: Any, k: Any, v: Any, k_norm: float, lengths: Any = None) -> Any:
        import torch

        qb = _q32(q)
        if not _cheap(qb, self.scale, k_norm):
            return None
        kw = self.kw
        if lengths is not None:  # row b's keys [0, lengths[b]) as spans, as describe() gives them for this read
            spans = np.zeros((q.shape[0], 1, 1, 4), np.int64)
            spans[:, 0, 0, 1] = np.minimum(lengths.numpy(), k.shape[2])
            kw = {**kw, "spans": spans}
        out, _, _ = kernel.decode_into(qb, k, v, self.stored, self.scale, None, v.shape[-1], kw)
        return as_result(torch.from_numpy(out), self.dtype, True)


class _QuantizedRead:
    """The decode pass on a plain read of a quantized cache: :func:`kernel.decode` as the kernel backend calls it
    (q turned as the keys were stored, the call's visibility: every key, the sinks), the codes read as stored."""

    def __init__(self, call: Call):
        self.scale, self.visible, self.dtype = call.problem.scale, call.visible, call.problem.dtype
        self.sinks = call.options.sink_logits

    def __call__(self, q: Any, k: Any, v: Any, k_norm: float, lengths: Any = None) -> Any:
        if not _cheap(_q32(q), self.scale, k_norm):  # (lengths: always None, a ragged read is not kept here)
            return None
        out, _ = kernel.decode(rotated_q(q, k), k, v, scale=self.scale, visible=self.visible, sinks=self.visible.sinks,
                               check=False)
        return as_result(out, self.dtype, True)


class _SdpaRead:
    """SDPA on a plain read of a cache in q's dtype, as the sdpa backend calls it for one (grouped) row."""

    def __init__(self, call: Call):
        self.scale, self.gqa, self.sinks = call.problem.scale, call.problem.groups > 1, None

    def __call__(self, q: Any, k: Any, v: Any, k_norm: float, lengths: Any = None) -> Any:
        import torch.nn.functional as F  # (lengths: always None, a ragged read is not kept here)

        if not checked_bound(q, None, self.scale, k_norm) <= CHEAP_BOUND_OK:
            return None
        return F.scaled_dot_product_attention(q, k, v, scale=self.scale, enable_gqa=self.gqa)

