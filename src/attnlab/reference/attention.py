"""The specification: attention in float64 NumPy.

Every other backend is tested against :func:`attention` here. It is written to be read, not to
be fast: scores, mask, softmax, weighted sum, each one line.

    s_ij = scale · q_i · k_j                 (with ``softcap`` c: c · tanh(s_ij / c), as Gemma-2)
    s_ij = score_mod(s_ij + bias_ij, b, h, i, j)   (−∞ where the mask says False)
    α_ij = exp(s_ij) / (Σ_l exp(s_il) + exp(sink_h))   (no sink: the plain softmax;
                                                         a row with nothing allowed: α_i = 0)
    o_i  = Σ_j α_ij v_j
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab import masks
from attnlab.masks.frame import Frame, as_numpy, split_batch
from attnlab.reference import validate


def logsumexp(x: Any, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """log Σ exp(x) along ``axis``, stable for any finite x; −inf where every entry is −inf."""
    x = np.asarray(x, dtype=np.result_type(x, np.float32))
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # an all −inf row: shift by 0, the sum is 0, log 0 = −inf
    with np.errstate(divide="ignore", over="ignore"):  # x − m may overflow to −inf: exp gives 0, as it should
        out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def softmax(x: Any, axis: int = -1) -> np.ndarray:
    """exp(x) / Σ exp(x) along ``axis``, stable for scores of ±1e4 and beyond.

    Subtracting the row maximum before ``exp`` keeps every exponent ≤ 0, so nothing overflows.
    A row that is −inf everywhere (nothing to attend to) gives zeros, not NaN.
    """
    x = np.asarray(x, dtype=np.result_type(x, np.float32))
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(over="ignore"):  # x − m may overflow to −inf for |x| near 1e308: exp gives 0
        e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def softmax_jacobian(alpha: Any) -> np.ndarray:
    """∂α_i/∂s_j = α_i (δ_ij − α_j) for α = softmax(s) over the last axis: (..., n) → (..., n, n).

    It goes to 0 as one weight approaches 1: the vanishing slope that 1/√d guards against.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    return alpha[..., :, None] * (np.eye(alpha.shape[-1]) - alpha[..., None, :])


def scores(q: Any, k: Any, *, scale: float | None = None) -> np.ndarray:
    """scale · q kᵀ in float64: (..., Tq, D), (..., Tk, D) → (..., Tq, Tk)."""
    scale = validate.check_scale(scale, np.shape(q)[-1])
    return np.matmul(np.asarray(q, np.float64), np.swapaxes(np.asarray(k, np.float64), -1, -2)) * scale


def _frame(p: validate.Problem, description: masks.Mask | None) -> Frame:
    ends = None if description is None else description.ends()
    return Frame.of(p.tq, p.tk, p.batch, ends)


def _description(p: validate.Problem, mask: Any, causal: bool, window: Any, lengths: Any) -> masks.Mask | None:
    """The call's visibility as one attnlab.masks description (the keywords are its shorthands)."""
    if hasattr(mask, "shape"):
        validate.check_mask(mask, p)
    return masks.from_keywords(mask, causal, window, None if lengths is None else validate.check_lengths(lengths, p))


def _in_bh(s: np.ndarray, frame: Frame) -> np.ndarray:
    """Scores (*batch, Tq, Tk) as (B, H, Tq, Tk), the masks' index space."""
    return s.reshape(*split_batch(frame.batch), frame.tq, frame.tk)


def masked_scores(q: Any, k: Any, p: validate.Problem, *, mask: Any = None, bias: Any = None, causal: bool = False,
                  softcap: float | None = None, lengths: Any = None, window: Any = None, score_mod: Any = None) -> np.ndarray:
    """The scores (..., Tq, Tk) as the softmax takes them, in float64: scale · q·k, softcap, bias, score_mod,
    then −inf where the description hides a pair (its rule, :meth:`attnlab.masks.Mask.allows`)."""
    validate.check_bias(bias, p)
    if validate.is_torch(q):
        raise TypeError("the numpy reference takes NumPy arrays; use backend='torch' for tensors")
    softcap = validate.check_softcap(softcap)
    description = _description(p, mask, causal, window, lengths)
    frame = _frame(p, description)
    s = scores(q, k, scale=p.scale)  # (..., Tq, Tk)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    if score_mod is not None:
        changed = masks.as_score_mod(score_mod)(frame, _in_bh(s, frame), *frame.grid())  # (B, H, Tq, Tk)
        s = np.asarray(changed, np.float64).reshape(s.shape)
    if description is not None:
        allowed = np.asarray(description.allows(frame, *frame.grid()))  # (B|1, H|1, Tq, Tk)
        s = np.where(np.broadcast_to(allowed, _in_bh(s, frame).shape).reshape(s.shape), s, -np.inf)
    return s


def lse_with_sinks(s: np.ndarray, sink_logits: Any, p: validate.Problem) -> np.ndarray:
    """Each row's log-sum-exp of its scores (..., Tq), and of its head's sink logit where there are sinks."""
    lse = logsumexp(s)
    if sink_logits is None:
        return lse
    sink = as_numpy(sink_logits).astype(np.float64)
    return np.logaddexp(lse, np.broadcast_to(sink.reshape(sink.shape + (1,)), lse.shape))


def _softmax_with_sinks(s: np.ndarray, sinks: Any, p: validate.Problem) -> np.ndarray:
    """Each row's softmax over its scores and its head's sink logit, the sink's own weight left out."""
    sink = as_numpy(sinks).astype(np.float64)
    sink = np.broadcast_to(sink.reshape(sink.shape + (1, 1)), (*p.batch, p.tq, 1))  # (..., Tq, 1)
    return softmax(np.concatenate([s, sink], axis=-1), axis=-1)[..., :-1]


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    causal: bool = False,
    scale: float | None = None,
    return_weights: bool = False,
    softcap: float | None = None,
    lengths: Any = None,
    window: Any = None,
    score_mod: Any = None,
    sink_logits: Any = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention, the float64 specification.

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv); leading dims broadcast.
    mask: which keys each query sees: a boolean array (True = may attend, broadcastable to (..., Tq, Tk)),
        a ``mask_mod(b, h, q_idx, kv_idx)`` callable or attnlab.masks objects (evaluated by their rule).
    bias: float added to the scores (−inf blocks a pair), broadcastable to (..., Tq, Tk).
    causal: masks.causal(): query i sees keys 0..Tk−Tq+i (aligned bottom-right when Tq ≠ Tk); with
        ``lengths`` each sequence's own: query i of sequence b sees keys 0..lengths[b]−Tq+i.
    window: masks.window(left, right) (an int w: both sides).
    scale: default 1/√D; ``scale=1.0`` is the unscaled scene.
    softcap: logit softcapping c > 0 (Gemma-2): the scaled scores become c · tanh(s / c), bounded
        by ±c, before the bias, the score_mod and the mask.
    lengths: masks.cache_lengths(lengths): each sequence's keys (ints shaped like the first batch dims),
        its queries its newest tokens.
    score_mod: masks.alibi(slopes) or a ``score_mod(score, b, h, q_idx, kv_idx)`` callable.
    sink_logits: one learned sink logit per query head (broadcast against q's leading dims): it takes
        part in each row's softmax and has no value.

    Returns the output (..., Tq, Dv) in q's dtype where k and v are a 16-bit cache under a float32
    query, else in the promoted dtype of q, k, v (computed in float64 on the values as stored),
    and with ``return_weights`` the weights (..., Tq, Tk) too.
    """
    p = validate.check_qkv(q, k, v, scale)
    s = masked_scores(q, k, p, mask=mask, bias=bias, causal=causal, softcap=softcap, lengths=lengths, window=window,
                      score_mod=score_mod)
    weights = softmax(s, axis=-1) if sink_logits is None else _softmax_with_sinks(s, sink_logits, p)  # (..., Tq, Tk)
    out = np.matmul(weights, np.asarray(v, np.float64))  # (..., Tq, Dv)

    out = out.astype(p.dtype, copy=False)
    if return_weights:
        return out, weights.astype(p.dtype, copy=False)
    return out
