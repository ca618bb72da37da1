"""One forward pass as each layer of attnlab's transformer sees it (:class:`Pass`, the frozen per-call
description), and how a layer computes its attention with it: through :func:`attnlab.attention` and
the backend the pass names, or, where the scores or the pattern are hooked, the torch backend's math
written out so that the hooks can read and replace them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.backends.api import attention
from attnlab.backends.request import repeat_groups
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
    rope: Any = None  # rotary cos and sin of the positions, (T, Dh) or (B, 1, T, Dh) each
    kv: KVCache | None = None  # decoding: the cache the new tokens are appended to ...
    step: Step | None = None  # ... and what this call appends
    rows: list | None = None  # maps of decoding: each layer appends (weights (B, H, Tk), key positions (B, Tk))

    def allowed(self, t: int, device: Any, window: int | None = None) -> Any:
        """Which keys each query may attend to, (B or 1, 1, T, T) bool, or None: every one."""
        keys = self.key_mask
        if self.lengths is not None:
            keys = (torch.arange(t, device=device) < self.lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
        if not self.causal:
            return keys
        tril = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # (T, T)
        if window is not None:
            tril = tril & ~torch.ones(t, t, dtype=torch.bool, device=device).tril(-window)  # i − W < j ≤ i
        return tril if keys is None else tril & keys


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass, kw: dict) -> tuple:
    """attnlab.attention on torch tensors (the float64 NumPy reference gets NumPy copies, no gradients):
    z (B, H, Tq, Dh) and, when decoding keeps rows, the last query's weights (B, H, Tk)."""
    c = p.config
    kw = dict(kw, backend=p.backend, scale=c.attn_scale, softcap=c.attn_softcap)
    if p.rows is not None:
        kw["weights_rows"] = [q.shape[2] - 1]
    if p.backend == "numpy":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError("backend 'numpy' computes on float64 NumPy copies, without gradients; run under "
                             "torch.no_grad() or choose a backend with gradients (torch, blockwise, kernel)")
        arrays = [t.detach().cpu().double().numpy() for t in (q, k, v)]
        kw = {n: (x.cpu().numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
        out = attention(*arrays, **kw)
        out = [torch.from_numpy(o).to(device=q.device, dtype=q.dtype) for o in (out if isinstance(out, tuple) else (out,))]
    else:
        out = attention(q, k, v, **kw)
        out = list(out) if isinstance(out, tuple) else [out]
    return out[0], (out[1][:, :, 0] if p.rows is not None else None)


def attend_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass, at: str, allowed: Any) -> tuple:
    """Backend "torch"'s math written out, so ``hook_attn_scores`` (after scale, softcap and mask, before
    the softmax) and ``hook_pattern`` can read or replace the scores and weights (B, H, Tq, Tk); z = pattern · v.
    Decoding: the keys are the cache's, in its slot order (``allowed`` says which each query sees)."""
    c, g = p.config, q.shape[1] // k.shape[1]
    k, v = repeat_groups(k.to(q.dtype), g), repeat_groups(v.to(q.dtype), g)  # (B, H, Tk, Dh): each query head's k/v head
    scale = c.attn_scale if c.attn_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    if c.attn_softcap is not None:
        s = c.attn_softcap * torch.tanh(s / c.attn_softcap)
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    s = p.hooks(at + "hook_attn_scores", s)
    w = p.hooks(at + "hook_pattern", torch.softmax(s, dim=-1).nan_to_num(nan=0.0))  # a row with no key: zeros
    return torch.matmul(w, v), (w[:, :, -1] if p.rows is not None else None)  # (B, H, Tq, Dh), (B, H, Tk)
