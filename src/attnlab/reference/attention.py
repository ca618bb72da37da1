"""The specification: attention in float64 NumPy.

Every other backend is tested against :func:`attention` here. It is written to be read, not to
be fast: scores, mask, softmax, weighted sum, each one line.

    s_ij = scale · q_i · k_j + bias_ij      (−∞ where the mask says False)
           (with ``softcap`` c: s_ij = c · tanh(scale · q_i · k_j / c) + bias_ij, as Gemma-2)
    α_ij = exp(s_ij) / Σ_l exp(s_il)         (a row with nothing allowed: α_i = 0)
    o_i  = Σ_j α_ij v_j
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.reference import validate
from attnlab.reference.masks import by_batch, causal_mask, combine


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


def _keys(p: validate.Problem, causal: bool, lengths: Any) -> np.ndarray | None:
    """The causal band and the key padding as one mask broadcastable to (..., Tq, Tk), or None."""
    if lengths is None:
        return causal_mask(p.tq, p.tk) if causal else None
    n = by_batch(validate.check_lengths(lengths, p), len(p.batch))  # (*batch prefix, 1, …)
    padding = np.arange(p.tk) < n[..., None, None]  # (..., 1, Tk)
    return padding & causal_mask(p.tq, p.tk, lengths=n) if causal else padding


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
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention, the float64 specification.

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv); leading dims broadcast.
    mask: bool, True = may attend, broadcastable to (..., Tq, Tk).
    bias: float added to the scores (−inf blocks a pair), broadcastable to (..., Tq, Tk).
    causal: query i sees keys 0..Tk−Tq+i (aligned bottom-right when Tq ≠ Tk); with ``lengths``
        each sequence's own: query i of sequence b sees keys 0..lengths[b]−Tq+i.
    scale: default 1/√D; ``scale=1.0`` is the unscaled scene.
    softcap: logit softcapping c > 0 (Gemma-2): the scaled scores become c · tanh(s / c), bounded
        by ±c, before the bias and the mask.
    lengths: each sequence's real keys, ints shaped like the first batch dims (a prefix of them):
        keys at positions ≥ length are padding.

    Returns the output (..., Tq, Dv) in q's dtype where k and v are a 16-bit cache under a float32
    query, else in the promoted dtype of q, k, v (computed in float64 on the values as stored),
    and with ``return_weights`` the weights (..., Tq, Tk) too.
    """
    p = validate.check_qkv(q, k, v, scale)
    validate.check_mask(mask, p)
    validate.check_bias(bias, p)
    if validate.is_torch(q):
        raise TypeError("the numpy reference takes NumPy arrays; use backend='torch' for tensors")

    softcap = validate.check_softcap(softcap)
    s = scores(q, k, scale=p.scale)  # (..., Tq, Tk)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    allowed = combine(mask, _keys(p, causal, lengths))
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    weights = softmax(s, axis=-1)  # (..., Tq, Tk); all-blocked rows are 0
    out = np.matmul(weights, np.asarray(v, np.float64))  # (..., Tq, Dv)

    out = out.astype(p.dtype, copy=False)
    if return_weights:
        return out, weights.astype(p.dtype, copy=False)
    return out
