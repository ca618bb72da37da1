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
- "yarn" (Peng et al. 2023; gpt-oss): each frequency blends θ^(−2i/Dh) / factor (interpolated) and
  θ^(−2i/Dh) (kept) by a ramp over the dims between ``rope_beta_fast`` and ``rope_beta_slow``
  rotations in ``rope_original_positions`` (rounded out when ``rope_truncate``), and cos and sin are
  multiplied by ``rope_attention_factor`` (transformers' ``_compute_yarn_parameters``).

Gemma-3's sliding layers turn by plain rotary with their own base, ``rope_local_theta``
(:func:`frequencies` with ``local=True``).
"""

from __future__ import annotations

import math

import torch

from attnlab.transformer.config import TransformerConfig


def frequencies(c: TransformerConfig, local: bool = False) -> torch.Tensor:
    """The rotary frequencies (Dh/2,) of config ``c``, float64: its global layers', or with ``local``
    its sliding layers' (plain rotary of base ``rope_local_theta``)."""
    dh = c.rotary_dim
    base = c.rope_local_theta if local else c.rope_theta
    inv = 1.0 / base ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)  # (Dh/2,)
    if local:
        return inv
    if c.rope_type == "yarn":
        return _yarn(c, inv)
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


def _yarn(c: TransformerConfig, inv: torch.Tensor) -> torch.Tensor:
    """YaRN's blend of interpolated (inv / factor) and kept (inv) frequencies, ramped over the dims."""
    dh, base, orig = c.rotary_dim, c.rope_theta, c.rope_original_positions

    def dim_of(rotations: float) -> float:  # the dim that turns ``rotations`` times in the original length
        return dh * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(c.rope_beta_fast), dim_of(c.rope_beta_slow)
    if c.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dh - 1)
    high = high + 0.001 if low == high else high  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dh // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # (Dh/2,)
    keep = 1 - ramp  # 1: the fast-turning dims keep their frequency (extrapolation)
    return inv / c.rope_factor * (1 - keep) + inv * keep


def angles(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
           factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, Dh) or (B, 1, T, Dh) of positions ``pos`` (T,) or (B, T), in ``dtype``, times
    ``factor`` (YaRN's attention factor): once per forward."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    a = pos[..., None].to(wide) * inv_freq.to(device=pos.device, dtype=wide)  # (T, Dh/2) or (B, T, Dh/2)
    a = torch.cat((a, a), dim=-1)  # (.., T, Dh)
    if a.dim() == 3:
        a = a[:, None]  # (B, 1, T, Dh): broadcast over heads
    if factor != 1.0:
        return (a.cos() * factor).to(dtype), (a.sin() * factor).to(dtype)
    return a.cos().to(dtype), a.sin().to(dtype)


def rotate(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x (B, H, T, Dh) turned by the angles of :func:`angles`."""
    cos, sin = cos_sin
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
