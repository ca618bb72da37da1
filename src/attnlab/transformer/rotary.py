"""Rotary positions (Su et al. 2021) in Llama's half-split layout, with Llama-3's and linear scaling.

The frequencies are computed once per model in float64; the angles position × frequency in the
query's precision, float32 at least (transformers computes them in float32; attnlab's float64
model keeps float64 throughout, so its cached and uncached passes agree to rounding).

- "default": θ^(−2i/Dh).
- "linear": every frequency divided by ``rope_factor`` (positions stretched by it).
- "llama3": frequencies whose wavelength exceeds ``rope_original_positions / rope_low_freq`` are
  divided by ``rope_factor``, those shorter than ``rope_original_positions / rope_high_freq`` kept,
  and those between interpolated smoothly (Meta's Llama 3.1 recipe, transformers'
  ``_compute_llama3_parameters``).
"""

from __future__ import annotations

import math

import torch

from attnlab.transformer.config import TransformerConfig


def frequencies(c: TransformerConfig) -> torch.Tensor:
    """The rotary frequencies (Dh/2,) of config ``c``, float64."""
    dh = c.head_dim
    inv = 1.0 / c.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)  # (Dh/2,)
    if c.rope_type == "linear":
        return inv / c.rope_factor
    if c.rope_type == "llama3":
        orig, low, high, factor = c.rope_original_positions, c.rope_low_freq, c.rope_high_freq, c.rope_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > orig / low, inv / factor, inv)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= orig / high) & (wavelen <= orig / low)
        return torch.where(medium, smoothed, scaled)
    return inv


def angles(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, Dh) or (B, 1, T, Dh) of positions ``pos`` (T,) or (B, T), in ``dtype``: once per forward."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    a = pos[..., None].to(wide) * inv_freq.to(device=pos.device, dtype=wide)  # (T, Dh/2) or (B, T, Dh/2)
    a = torch.cat((a, a), dim=-1)  # (.., T, Dh)
    if a.dim() == 3:
        a = a[:, None]  # (B, 1, T, Dh): broadcast over heads
    return a.cos().to(dtype), a.sin().to(dtype)


def rotate(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x (B, H, T, Dh) turned by the angles of :func:`angles`."""
    cos, sin = cos_sin
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
