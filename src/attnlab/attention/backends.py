"""One ``attention()`` in front of several backends, with dispatch (the xFormers way).

Each backend states what it supports and, for a call it cannot serve, why. ``backend="auto"``
takes the cheapest backend that accepts the call (by each backend's cost estimate); a backend named
by the caller never falls back to another, and when nothing can serve a call the error lists every
backend with its reason.

=========== =====================================================================================
numpy       the float64 NumPy reference, the specification (NumPy arrays only)
torch       the same math in PyTorch eager: every mask, weights, LSE, gradients, any device
sdpa        ``torch.nn.functional.scaled_dot_product_attention``: fused; no weights, no LSE
blockwise   attnlab's online-softmax kernel (compiled; or a NumPy/torch loop): O(T) memory, LSE, weight rows
=========== =====================================================================================
"""

from __future__ import annotations

from typing import Any

from attnlab.attention._calls import Backend, Request, prepare
from attnlab.attention.backend_blockwise import BlockwiseBackend
from attnlab.attention.backend_numpy import NumpyBackend
from attnlab.attention.backend_sdpa import SdpaBackend
from attnlab.attention.backend_torch import TorchBackend

BACKENDS: dict[str, Backend] = {b.name: b for b in (NumpyBackend(), TorchBackend(), SdpaBackend(), BlockwiseBackend())}


class NoBackendError(ValueError):
    """No backend (or not the one named) can serve a call; the message gives each one's reason."""


def refusals(request: Request) -> dict[str, str | None]:
    """Every backend's reason to refuse ``request``; None for the ones that accept it."""
    reasons = {}
    for name, b in BACKENDS.items():
        why = b.refuse(request)
        if why is None and request.block_size and name != "blockwise":
            why = "has no block size (block_size= is a blockwise parameter)"
        reasons[name] = why
    return reasons


def choose(request: Request, backend: str = "auto") -> Backend:
    """The backend that serves ``request``: the named one, or for "auto" the cheapest that accepts it."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, got {backend!r}")
    reasons = refusals(request)
    if backend != "auto":
        if reasons[backend] is None:
            return BACKENDS[backend]
        raise NoBackendError(f"backend {backend!r} cannot serve this call: {reasons[backend]}" + _listing(reasons))
    fits = [BACKENDS[n] for n, why in reasons.items() if why is None]
    if not fits:
        raise NoBackendError("no backend can serve this call" + _listing(reasons))
    return min(fits, key=lambda b: b.cost(request))


def _listing(reasons: dict[str, str | None]) -> str:
    return "".join(f"\n  {n}: {why or 'can serve it'}" for n, why in reasons.items())


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
    backend: "auto" (the cheapest that fits), "numpy", "torch", "sdpa" or "blockwise".
    block_size: blockwise tile size, an int or (queries, keys). Default: 96 × 512 in the compiled
        kernel (float32 on the CPU; it rounds the keys up to whole vectors, 16 with AVX-512),
        about 2^20 scores for all heads together in the Python loop.

    A row with nothing to attend to gives zeros. Returns ``out``, or a tuple
    ``(out, weights)``, ``(out, lse)`` or ``(out, weights, lse)`` as asked.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    call = prepare(
        q, k, v, mask=mask, bias=bias, causal=causal, scale=scale, window=window, lengths=lengths,
        return_weights=return_weights, weights_rows=weights_rows, return_lse=return_lse, block_size=block_size,
    )
    out, weights, lse = choose(call.request, backend).run(call)
    extra = ([weights] if (return_weights or weights_rows is not None) else []) + ([lse] if return_lse else [])
    return (out, *extra) if extra else out
