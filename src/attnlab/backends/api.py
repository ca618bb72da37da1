"""``attention()``: the one public function in front of the backends (:mod:`attnlab.backends.dispatch`)."""

from __future__ import annotations

from typing import Any

from attnlab.backends.dispatch import choose
from attnlab.backends.request import prepare


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
    backend: str = "auto",
    window: int | tuple[int, int] | None = None,
    lengths: Any = None,
    weights_rows: Any = None,
    return_lse: bool = False,
    block_size: int | tuple[int, int] | None = None,
    softcap: float | None = None,
) -> Any:
    """Scaled dot-product attention on NumPy arrays or torch tensors, by the backend that fits.

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv), leading dims broadcast. k and v may
    have fewer heads (dim −3) than q, Hq = G·Hkv (grouped-query attention: query head h uses
    key/value head h // G). The result has q's kind, device and dtype (promoted for NumPy).

    mask: bool, True = may attend, broadcastable to (..., Tq, Tk).
    bias: float added to the scores (−inf blocks a pair), broadcastable to (..., Tq, Tk).
    causal: query i sees keys up to Tk − Tq + i (bottom-right aligned when Tq ≠ Tk).
    scale: default 1/√D.
    window: sliding window, an int w (w keys each side) or (left, right): query i sees keys
        pos(i) − left .. pos(i) + right; with ``causal`` the right side is cut at 0.
    lengths: key-padding lengths, ints shaped like the first batch dims (e.g. (B,) for q (B, H, T, D)):
        keys at positions ≥ length are padding.
    return_weights: also return every weight (..., Tq, Tk) (materialising backends only).
    weights_rows: query indices; also return the exact weights of just those rows (..., R, Tk),
        which blockwise recomputes from the LSE without the (Tq, Tk) matrix (outside autograd:
        a diagnostic, not differentiable there).
    return_lse: also return each row's log-sum-exp of its scores (..., Tq) (−inf: nothing to attend).
    backend: "auto", "numpy", "torch", "sdpa", "blockwise" or "kernel" (:mod:`attnlab.backends.dispatch`
        says what each serves). "auto" takes, among the backends that fit, the fastest on this
        machine that computes in the input's precision (float32 accumulation for float16/bfloat16):
        its result's precision never changes with the size of the call.
    block_size: tile size of blockwise and kernel, an int or (queries, keys). Default: 96 × 512 in
        the kernel (it rounds the keys up to whole vectors, 16 with AVX-512), about 2^20 scores for
        all heads together in the blockwise loop.
    softcap: logit softcapping c > 0 (Gemma-2): scaled scores become c · tanh(s / c) before the
        bias and the masks (numpy and torch backends).

    A row with nothing to attend to gives zeros. Returns ``out``, or a tuple
    ``(out, weights)``, ``(out, lse)`` or ``(out, weights, lse)`` as asked.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    call = prepare(
        q, k, v, mask=mask, bias=bias, causal=causal, scale=scale, window=window, lengths=lengths,
        return_weights=return_weights, weights_rows=weights_rows, return_lse=return_lse, block_size=block_size,
        softcap=softcap,
    )
    out, weights, lse = choose(call.request, backend).run(call)
    extra = ([weights] if (return_weights or weights_rows is not None) else []) + ([lse] if return_lse else [])
    return (out, *extra) if extra else out
