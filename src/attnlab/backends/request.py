"""One attention call, checked and described: what the dispatcher shows each backend.

:func:`prepare` checks every argument once (:mod:`attnlab.reference.validate`) and returns the :class:`Call`: the
normalised inputs plus a :class:`Request`, the plain facts (library, device, dtype, masks, outputs,
gradients) by which a backend accepts or refuses the call. Backends share the helpers here to
turn the call's masks into one dense boolean mask when they materialise the scores anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attnlab.backends import visible as vis
from attnlab.backends.options import Options
from attnlab.backends.quantized import stand_ins
from attnlab.reference import validate
from attnlab.reference.masks import combine
from attnlab.reference.quantized import QuantizedKV


@dataclass(frozen=True)
class Request:
    """What a call asks for, in the terms backends accept or refuse it by."""

    library: str  # "numpy" or "torch": the array library that came in and goes out
    device: str  # "cpu" for NumPy; the tensors' device otherwise ("cpu", "cuda:0", …)
    dtype: str  # the result's dtype
    problem: validate.Problem
    mask: bool  # a dense boolean mask was given
    bias: bool
    band: bool  # structured visibility (key intervals per row) that hides some key from some query
    causal: bool  # that structure holds causal
    structure: bool  # ... and more than causal and lengths: a window, documents, a prefix, sink tokens, key lengths
    lengths: bool  # ... and each sequence's own length (cache_lengths)
    mask_mod: bool  # a rule evaluated elementwise (a mask_mod callable, a union beyond two intervals)
    score_mod: bool  # a score_mod callable
    alibi: bool  # ALiBi slopes (a structured score change)
    sinks: bool  # learned sink logits
    weights: bool  # return_weights=True: every row's weights, (..., Tq, Tk)
    weights_rows: bool  # the weights of chosen query rows only
    lse: bool  # the rows' log-sum-exp
    grad: bool  # autograd will need gradients of q, k or v through this call
    bias_grad: bool  # ... and of the bias
    block_size: bool  # a block size was given (a blockwise parameter)
    softcap: bool  # logit softcapping (Gemma-2)
    kv_dtype: bool  # k and v stored in another dtype than q (a 16-bit cache under a float32 query)
    quantized: str  # k and v are a quantized cache's codes and scales (QuantizedKV): its kind ("int8", …), else ""
    visible: float  # the fraction of query-key pairs the band leaves (1 without causal/window)
    # no score |scale·q·k + bias| exceeds this (Cauchy–Schwarz): what overflow checks use; not part of the
    # call's kind (equality, hash), by which auto remembers its choices
    score_bound: float = field(default=0.0, compare=False)

    @property
    def scores(self) -> int:
        """How many query-key pairs the call has (B·H·Tq·Tk), before any mask."""
        return int(np.prod(self.problem.batch, dtype=np.int64)) * self.problem.tq * self.problem.tk


@dataclass(frozen=True)
class Call:
    """The checked arguments of one call (q, k, v as given: NumPy arrays or torch tensors) and its options."""

    q: Any
    k: Any
    v: Any
    options: Options
    visible: vis.Visible  # which keys each query sees and how scores change: the one description
    rows: np.ndarray | None  # query rows whose weights are wanted
    request: Request
    # q, k and v not yet read for NaN/Inf (prepare(defer_kv=True)): the backend that serves the call checks them
    # while it reads them (Backend.checks_kv), or checked() reads them first; request.score_bound is then the
    # bias's alone
    kv_pending: bool = False

    @property
    def problem(self) -> validate.Problem:
        return self.request.problem


def _rows(rows: Any, p: validate.Problem) -> np.ndarray | None:
    if rows is None:
        return None
    arr = np.asarray(rows)
    if arr.ndim == 0:
        arr = arr[None]
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1:
        raise TypeError(f"weights_rows must be a query index or a 1-D sequence of them, got {arr.dtype} of shape {arr.shape}")
    if arr.size == 0 or ((arr < -p.tq) | (arr >= p.tq)).any():
        raise ValueError(f"weights_rows must be query indices in 0..Tq-1={p.tq - 1}, got {arr.tolist()}")
    return arr % p.tq


def _fraction(v: vis.Visible) -> float:
    """The fraction of query-key pairs the structured part leaves (1 without one)."""
    if v.spans is None:
        return 1.0
    lo, hi = v.spans
    return float(np.clip(hi - lo, 0, None).sum(-1).mean()) / v.frame.tk


# No backend computes in a dtype narrower than float16: a cheap bound under a quarter of its range
# (base.OVERFLOW_LIMIT) needs no closer look.
CHEAP_BOUND_OK = 65504.0 / 4


def score_bound(q: Any, k: Any, bias: Any, scale: float, q_max: float, k_max: float) -> float:
    """An upper bound of every |scale·q_i·k_j + bias_ij|, from the largest |entries| q_max, k_max of q and k.

    Backends compare it with the range of the dtype they compute in, so that finite inputs whose
    scores would overflow are refused with that reason instead of giving NaN or a wrong number.
    First |scale|·D·q_max·k_max; where that is large, the closer |scale|·max|q_i|·max|k_j| (Cauchy–Schwarz,
    one more pass over q and k).
    """
    b_max = _bias_max(bias)
    bound = abs(scale) * q.shape[-1] * q_max * k_max
    if bound + b_max <= CHEAP_BOUND_OK:
        return bound + b_max
    return min(bound, abs(scale) * max_norm(q) * max_norm(k)) + b_max


def checked_bound(q: Any, bias: Any, scale: float, k_norm: float) -> float:
    """The score bound |scale|·max‖q_i‖·k_norm + max|bias| where ``k_norm`` bounds every key's length
    (keys checked when written): no pass over k."""
    return abs(scale) * max_norm(q) * k_norm + _bias_max(bias)


def max_norm(x: Any) -> float:
    """The largest row length ‖x_i‖ (last axis) of an array or tensor, 0 when empty: in the input's dtype
    (no copy, float32 for 16-bit), again in float64 where that overflowed."""
    if validate.is_torch(x):
        import torch

        if x.numel() == 0:
            return 0.0
        wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        norm = float(torch.linalg.vector_norm(x.detach(), dim=-1, dtype=wide).max())
        return norm if math.isfinite(norm) else float(torch.linalg.vector_norm(x.detach().double(), dim=-1).max())
    if x.size == 0:
        return 0.0
    with np.errstate(over="ignore"):
        norm = float(np.sqrt(np.einsum("...d,...d->...", x, x).max()))
    return norm if math.isfinite(norm) else float(np.sqrt(np.einsum("...d,...d->...", x, x, dtype=np.float64).max()))


def _bias_max(bias: Any) -> float:
    if bias is None or not (bias.numel() if validate.is_torch(bias) else np.size(bias)):
        return 0.0
    return float(bias.detach().abs().max() if validate.is_torch(bias) else np.abs(bias).max())


def _needs_grad(*xs: Any) -> bool:
    if not validate.is_torch(xs[0]):
        return False
    import torch

    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


class Unchecked(Exception):
    """Raised by a backend serving a call whose k and v are pending (Call.kv_pending) where its pass met what it
    cannot vouch for (a score or an output not finite, a score beyond its range): the caller checks k and v
    (:func:`checked`: the error that names k or v) and chooses again, as for a call checked first."""


# The most query rows of a call whose k and v check waits for the backend (prepare(defer_kv=True)): the
# compiled kernel's decode pass (backends.kernel.DECODE_MAX_TQ) checks them while reading them
DEFER_MAX_TQ = 32


def prepare(q: Any, k: Any, v: Any, options: Options | None = None, *, defer_kv: bool = False) -> Call:
    """Check q, k, v against ``options`` (default: none given); errors name the argument, what it got and
    what was expected. q, k and v are read for NaN/Inf (and their magnitude) (k and v not where
    ``options.kv_checked``), or, with ``defer_kv`` and at most DEFER_MAX_TQ query rows, later, all three
    (Call.kv_pending, :func:`checked`)."""
    o = Options() if options is None else options
    if not isinstance(o, Options):
        raise TypeError(f"options must be an attnlab.backends.options.Options, got {type(o).__name__}")
    stored = k, v  # a quantized cache's k and v are checked by their shape (stand-ins), read by the backend
    k, v = stand_ins(q, k, v) or stored
    p = validate.check_qkv(q, k, v, o.scale, gqa=True, finite=False)
    validate.check_bias(o.bias, p)
    for name, x in (("mask", o.mask), ("bias", o.bias), ("sink_logits", o.sink_logits)):
        if hasattr(x, "shape") and validate.is_torch(x) != validate.is_torch(q):
            raise TypeError(f"{name} must be of the same array library as q (NumPy array or torch tensor), got {type(x).__name__}")
    seen = vis.build(p, o.mask, o.causal, o.window, o.lengths, o.score_mod, o.sink_logits, o.softcap)
    quantized = stored[0].kind if isinstance(stored[0], QuantizedKV) else ""
    pending = defer_kv and not o.kv_checked and not quantized and p.tq <= DEFER_MAX_TQ
    request = _request(q, k, v, o, p, seen, _bound(q, *stored, o, p, pending), quantized)
    return Call(q, *stored, o, seen, _rows(o.weights_rows, p), request, pending)


def prepare_read(q: Any, k: Any, v: Any, options: Options) -> Call:
    """:func:`prepare` for a decoding step's read of a KV cache (torch tensors), which the cache and the model
    vouch for: k and v [B, H_kv, Tk, D] were checked when written (``options.kv_checked``, with their largest
    key length ``k_norm``) and q [B, H, Tq, D] is the model's own projection with the cache's head counts and
    dtype. So no shape check and no pass over k and v; q is checked (its norm, which the score bound needs, is
    finite only when q is) and every option as :func:`prepare` checks it. A quantized cache's k and v
    (:class:`QuantizedKV`) are finite by construction and carry their rows' bound (``k.norm``): they need no
    ``kv_checked`` and are described by their stand-ins, as :func:`prepare` describes them. Internal:
    ``attention()`` is the public entry, and this one serves only calls whose keys were checked."""
    o = options
    quantized = k.kind if isinstance(k, QuantizedKV) else ""
    if not (o.kv_checked or quantized):
        return prepare(q, k, v, o)
    ks, vs = stand_ins(q, k, v) or (k, v)  # (B, H_kv, Tk, D) in q's dtype for the codes: shapes only
    d = int(q.shape[-1])
    p = validate.Problem(tuple(q.shape[:-2]), int(q.shape[-2]), int(ks.shape[-2]), d, int(vs.shape[-1]),
                         validate.dtype_name(q), validate.check_scale(o.scale, d), int(q.shape[-3] // ks.shape[-3]),
                         validate.dtype_name(ks))
    validate.check_bias(o.bias, p)
    seen = vis.build(p, o.mask, o.causal, o.window, o.lengths, o.score_mod, o.sink_logits, o.softcap)
    bound = checked_bound(q, o.bias, p.scale, k.norm if quantized else o.k_norm)
    if not math.isfinite(bound):
        validate.check_finite("q", q)  # names q when it holds NaN or Inf; else the bound is only large
    return Call(q, k, v, o, seen, _rows(o.weights_rows, p), _request(q, ks, vs, o, p, seen, bound, quantized))


def _request(q: Any, k: Any, v: Any, o: Options, p: validate.Problem, seen: vis.Visible, bound: float,
             quantized: str = "") -> Request:
    """The facts of a checked call by which backends accept or refuse it (k, v: arrays, or a quantized
    cache's stand-ins)."""
    torch_in = validate.is_torch(q)
    alibi = isinstance(seen.score_mod, vis.masks.scores.Alibi)
    return Request(
        library="torch" if torch_in else "numpy",
        device=str(q.device) if torch_in else "cpu",
        dtype=p.dtype,
        problem=p,
        mask=seen.dense is not None,
        bias=o.bias is not None,
        band=seen.mask is not None,
        causal=seen.causal,
        structure=seen.structure,
        lengths=seen.lengths,
        mask_mod=seen.rule is not None,
        score_mod=seen.score_mod is not None and not alibi,
        alibi=alibi,
        sinks=seen.sinks is not None,
        weights=o.return_weights,
        weights_rows=o.weights_rows is not None,
        lse=o.return_lse,
        grad=_needs_grad(q, k, v, o.bias, o.sink_logits),
        bias_grad=_needs_grad(o.bias) if o.bias is not None else False,
        block_size=o.block_size is not None,
        softcap=o.softcap is not None,
        kv_dtype=p.kv_dtype != p.dtype,
        quantized=quantized,
        visible=_fraction(seen),
        score_bound=bound,
    )


def checked(call: Call) -> Call:
    """A pending call (Call.kv_pending) with q, k and v checked now: the same errors (q's first) and score bound
    as prepare's."""
    if not call.kv_pending:
        return call
    q, k, o = call.q, call.k, call.options
    q_max, k_max, _ = (validate.check_finite(name, x) for name, x in (("q", q), ("k", k), ("v", call.v)))
    bound = score_bound(q, k, o.bias, call.problem.scale, q_max, k_max)
    return replace(call, request=replace(call.request, score_bound=bound), kv_pending=False)


def _bound(q: Any, k: Any, v: Any, o: Options, p: validate.Problem, pending: bool) -> float:
    """The call's score bound, after the finite checks: of q, k and v, or of q alone where k and v were checked;
    of the bias alone where the three are pending (the backend that reads them checks them, q with them)."""
    if pending:
        return _bias_max(o.bias)
    q_max = validate.check_finite("q", q)
    if isinstance(k, QuantizedKV):  # finite by construction; its rows' bound is stored
        return checked_bound(q, o.bias, p.scale, k.norm)
    if o.kv_checked:
        return checked_bound(q, o.bias, p.scale, o.k_norm)
    k_max, _ = (validate.check_finite(name, x) for name, x in (("k", k), ("v", v)))
    return score_bound(q, k, o.bias, p.scale, q_max, k_max)


def dense_mask(call: Call) -> Any:
    """The call's whole visibility as one boolean mask broadcastable to (..., Tq, Tk), or None.

    For the backends that materialise the scores; a mask given as an array stays as it is when it is
    the only restriction (a tensor stays on its device). Built per sequence and head only where the
    description depends on them.
    """
    v = call.visible
    keep = v.keep()  # (B|1, H|1, Tq, Tk) or None
    if keep is None:
        return v.dense
    keep = in_batch(keep, call.problem.batch)
    if v.dense is None:
        return keep
    m = v.dense.detach().cpu().numpy() if validate.is_torch(v.dense) else v.dense
    return combine(m, keep)


def in_batch(x: np.ndarray, batch: tuple) -> np.ndarray:
    """An array (B|1, H|1, ...) of the masks' (B, H) space shaped to broadcast against the call's ``batch`` dims."""
    b, h = x.shape[:2]
    rest = x.shape[2:]
    if b == 1:
        return x.reshape(((h,) if h > 1 and batch else ()) + rest)
    return x.reshape(*batch[:-1], h, *rest)


def repeat_groups(x: Any, groups: int) -> Any:
    """k or v (..., Hkv, T, ·) → (..., Hkv·groups, T, ·): the key/value head of each query head."""
    if groups == 1:
        return x
    if validate.is_torch(x):
        return x.repeat_interleave(groups, dim=-3)
    return np.repeat(x, groups, axis=-3)
