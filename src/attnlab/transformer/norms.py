"""The norms of attnlab's transformer: LayerNorm, RMSNorm and Gemma's (1 + w) RMSNorm, hookable at their scale."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.hooks import Hooks


class RMSNormPlusOne(nn.Module):
    """Gemma's RMSNorm: x / rms(x) · (1 + w), w starting at 0, computed in float32 or wider."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.to(wide.dtype))
        return y.to(x.dtype)


def norm(c: TransformerConfig) -> nn.Module:
    if c.norm == "layernorm":
        return nn.LayerNorm(c.d_model, eps=c.norm_eps)
    return RMSNormPlusOne(c.d_model, c.norm_eps) if c.norm_plus_one else nn.RMSNorm(c.d_model, eps=c.norm_eps)


def head_norm(c: TransformerConfig) -> nn.Module:
    """QK-norm's RMSNorm over one head's Dh (Qwen3: w; Gemma-3: (1 + w))."""
    return RMSNormPlusOne(c.head_dim, c.norm_eps) if c.norm_plus_one else nn.RMSNorm(c.head_dim, eps=c.norm_eps)


def normed(n: nn.Module, x: torch.Tensor, hooks: Hooks, at: str) -> torch.Tensor:
    """n(x); with ``{at}.hook_scale`` watched, by hand, so the scale (B, T, 1) can be read or replaced."""
    name = at + ".hook_scale"
    if not hooks.wants(name):
        return n(x)
    if isinstance(n, nn.LayerNorm):
        x = x - x.mean(-1, keepdim=True)  # (B, T, d): LayerNorm's scale is the centred input's RMS
    scale = hooks(name, (x.pow(2).mean(-1, keepdim=True) + n.eps).sqrt())  # (B, T, 1)
    y = x / scale * (1.0 + n.weight if isinstance(n, RMSNormPlusOne) else n.weight)
    return y if getattr(n, "bias", None) is None else y + n.bias
