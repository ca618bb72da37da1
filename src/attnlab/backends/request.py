"""One attention call, checked and described: what the dispatcher shows each backend.

:func:`prepare` checks every argument once (:mod:`attnlab.reference.validate`) and returns the :class:`Call`: the
normalised inputs plus a :class:`Request`, the plain facts (library, device, dtype, masks, outputs,
gradients) by which a backend accepts or refuses the call. Backends share the helpers here to
turn the call's masks into one dense boolean mask when they materialise the scores anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnlab.backends.options import Options
from attnlab.reference import validate
from attnlab.reference.masks import band_mask, by_batch, combine


@dataclass(frozen=True)
class Request:
    """What a call asks for, in the terms backends accept or refuse it by."""

    library: str  # "numpy" or "torch": the array library that came in and goes out
    device: str  # "cpu" for NumPy; the tensors' device otherwise ("cpu", "cuda:0", …)
    dtype: str  # the result's dtype
    problem: validate.Problem
    mask: bool  # a dense boolean mask was given
    bias: bool
    band: bool  # causal and/or a sliding window that hides some key from some query
    causal: bool  # causal was asked (its band may hide nothing: one query after every key)
    window: bool  # a sliding window (band beyond causal)
    lengths: bool  # key-padding lengths
    weights: bool  # return_weights=True: every row's weights, (..., Tq, Tk)
    weights_rows: bool  # the weights of chosen query rows only
    lse: bool  # the rows' log-sum-exp
    grad: bool  # autograd will need gradients of q, k or v through this call
    bias_grad: bool  # ... and of the bias
    block_size: bool  # a block size was given (a blockwise parameter)
    softcap: bool  # logit softcapping (Gemma-2)
    kv_dtype: bool  # k and v stored in another dtype than q (a 16-bit cache under a float32 query)
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
    left: int | None  # band: query i sees keys pos(i) − left .. pos(i) + right (None = unbounded)
    right: int | None
    klen: np.ndarray | None  # key-padding lengths broadcast to the batch shape, int64
    rows: np.ndarray | None  # query rows whose weights are wanted
    request: Request

    @property
    def problem(self) -> validate.Problem:
        return self.request.problem


def _lengths(lengths: Any, p: validate.Problem) -> np.ndarray | None:
    """Key-padding lengths broadcast to the batch shape (they are shaped like its first dims, e.g. (B,))."""
    if lengths is None:
        return None
    return np.broadcast_to(by_batch(validate.check_lengths(lengths, p), len(p.batch)), p.batch)


def hides_nothing(left: int | None, right: int | None, tq: int, tk: int) -> bool:
    """Whether the band (left, right) lets every query i, at pos(i) = Tk − Tq + i, see every key 0..Tk − 1."""
    return (left is None or left >= tk - 1) and (right is None or right >= tq - 1)


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


def _visible(tk: int, left: int | None, right: int | None) -> float:
    """About what fraction of the keys a query sees in the band (causal: a half)."""
    reach = (tk / 2 if left is None else left) + (tk / 2 if right is None else right) + 1
    return min(1.0, reach / tk)


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


def prepare(q: Any, k: Any, v: Any, options: Options | None = None) -> Call:
    """Check q, k, v against ``options`` (default: none given); errors name the argument, what it got and
    what was expected. k and v are read for NaN/Inf (and their magnitude) unless ``options.kv_checked``."""
    o = Options() if options is None else options
    if not isinstance(o, Options):
        raise TypeError(f"options must be an attnlab.backends.options.Options, got {type(o).__name__}")
    p = validate.check_qkv(q, k, v, o.scale, gqa=True, finite=False)
    validate.check_mask(o.mask, p)
    validate.check_bias(o.bias, p)
    for name, x in (("mask", o.mask), ("bias", o.bias)):
        if x is not None and validate.is_torch(x) != validate.is_torch(q):
            raise TypeError(f"{name} must be of the same array library as q (NumPy array or torch tensor), got {type(x).__name__}")
    left, right = o.band
    torch_in = validate.is_torch(q)
    klen = _lengths(o.lengths, p)
    if klen is not None and bool((klen == p.tk).all()):
        klen = None  # every sequence as long as the keys: under either causal rule, the call without lengths
    if klen is None and hides_nothing(left, right, p.tq, p.tk):
        left = right = None  # one query after every key (a decoding step): the call without its band
    request = Request(
        library="torch" if torch_in else "numpy",
        device=str(q.device) if torch_in else "cpu",
        dtype=p.dtype,
        problem=p,
        mask=o.mask is not None,
        bias=o.bias is not None,
        band=left is not None or right is not None,
        causal=o.causal,
        window=o.window is not None and (left, right) != (None, None),
        lengths=klen is not None,
        weights=o.return_weights,
        weights_rows=o.weights_rows is not None,
        lse=o.return_lse,
        grad=_needs_grad(q, k, v, o.bias),
        bias_grad=_needs_grad(o.bias) if o.bias is not None else False,
        block_size=o.block_size is not None,
        softcap=o.softcap is not None,
        kv_dtype=p.kv_dtype != p.dtype,
        visible=_visible(p.tk, left, right),
        score_bound=_bound(q, k, v, o, p),
    )
    return Call(q, k, v, o, left, right, klen, _rows(o.weights_rows, p), request)


def _bound(q: Any, k: Any, v: Any, o: Options, p: validate.Problem) -> float:
    """The call's score bound, after the finite checks: of q, k and v, or of q alone where k and v were checked."""
    q_max = validate.check_finite("q", q)
    if o.kv_checked:
        return checked_bound(q, o.bias, p.scale, o.k_norm)
    k_max, _ = (validate.check_finite(name, x) for name, x in (("k", k), ("v", v)))
    return score_bound(q, k, o.bias, p.scale, q_max, k_max)


def _unbroadcast(x: np.ndarray) -> np.ndarray:
    """A broadcast array with size 1 along the dims it was broadcast over (lengths (B, 1) for (B, H)), so
    that the masks built from it hold no copies: a mask per sequence, not per head."""
    return x[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in x.strides)]


def dense_mask(call: Call) -> np.ndarray | None:
    """The call's band, key padding and mask as one boolean mask broadcastable to (..., Tq, Tk).

    For the backends that materialise the scores; the mask given by the user stays as it is when
    it is the only restriction (a tensor stays on its device).
    """
    p = call.problem
    parts = []
    klen = None if call.klen is None else _unbroadcast(call.klen)
    if call.left is not None or call.right is not None:
        ends = klen if call.options.by_length else None  # each sequence's own positions
        parts.append(band_mask(p.tq, p.tk, left=call.left, right=call.right, lengths=ends))  # (Tq, Tk) or (*S, Tq, Tk)
    if klen is not None:
        parts.append(np.arange(p.tk) < klen[..., None, None])  # (*S, 1, Tk)
    if not parts:
        return call.options.mask
    m = call.options.mask
    if m is not None and validate.is_torch(m):
        m = m.detach().cpu().numpy()
    return combine(m, *parts)


def repeat_groups(x: Any, groups: int) -> Any:
    """k or v (..., Hkv, T, ·) → (..., Hkv·groups, T, ·): the key/value head of each query head."""
    if groups == 1:
        return x
    if validate.is_torch(x):
        return x.repeat_interleave(groups, dim=-3)
    return np.repeat(x, groups, axis=-3)
