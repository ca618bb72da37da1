"""The transformer's linear layers: torch's, but for the few rows of a decoding step.

A decoding step multiplies each weight matrix by one row per sequence, so its time is the read of
the weights from memory. torch's CPU linear reads a row-major (out, in) float32 matrix at about a
third of the memory bandwidth for so few rows (see benchmarks/README.md); the compiled
:mod:`attnlab.transformer._matvec` streams it once, the threads splitting the output rows. It serves
float32 CPU calls of at most ``MAX_ROWS`` rows that autograd does not track; every other call
(prefill, training, other dtypes and devices, or a build without a C compiler) is ``F.linear``.
The result is the same product, summed in another order (float32 rounding apart).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

try:
    from attnlab.transformer import _matvec
except ImportError:  # built without a C compiler: torch's linear serves every call
    _matvec = None

MAX_ROWS = 0 if _matvec is None else _matvec.MAX_ROWS


def _fits(x: torch.Tensor, weight: torch.Tensor, bias: Any) -> bool:
    rows = x.numel() // max(weight.shape[1], 1)
    return (0 < rows <= MAX_ROWS and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and weight.is_contiguous() and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad))))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x (..., in) · weight (out, in)ᵀ + bias (out,) → (..., out)."""
    if _matvec is None or not _fits(x, weight, bias):
        return F.linear(x, weight, bias)
    rows, (out_features, in_features) = x.numel() // weight.shape[1], weight.shape
    out = torch.empty(*x.shape[:-1], out_features, dtype=x.dtype)
    x = x.detach().contiguous()
    _matvec.linear(weight.detach().numpy(), x.numpy(), None if bias is None else bias.detach().numpy(),
                   out.numpy(), rows, out_features, in_features)
    return out


class Linear(nn.Linear):
    """``nn.Linear`` (the same parameters and state dict) whose forward is :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
