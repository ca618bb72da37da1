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


def rotate(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, Dh) turned by positions ``pos`` (T,) or (B, T) at frequencies ``inv_freq`` (Dh/2,)."""
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    angles = pos[..., None].to(wide) * inv_freq.to(device=x.device, dtype=wide)  # (T, Dh/2) or (B, T, Dh/2)
    angles = torch.cat((angles, angles), dim=-1)  # (.., T, Dh)
    if angles.dim() == 3:
        angles = angles[:, None]  # (B, 1, T, Dh): broadcast over heads
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
