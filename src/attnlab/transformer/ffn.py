"""The dense feed-forward network of attnlab's transformer (:class:`FeedForward`): up → act → down, or the
gated kind act(gate x) ⊙ up x → down (SwiGLU, GeGLU). Routed experts (:mod:`attnlab.transformer.routed`)
use it for their shared expert and for the dense layers of a mixture."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.hooks import Hooks
from attnlab.transformer.linear import Linear

ACT = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu, "silu": F.silu}


class FeedForward(nn.Module):
    """``c``'s FFN of width ``d_ff`` (default: the config's); gated unless ``c.ffn`` is "mlp" (a mixture's
    dense layers and shared experts are SwiGLUs)."""

    def __init__(self, c: TransformerConfig, d_ff: int | None = None):
        super().__init__()
        f = c.hidden_ff if d_ff is None else d_ff
        self.act = ACT[c.activation]
        self.up = Linear(c.d_model, f, bias=c.ffn_bias)
        self.gate = Linear(c.d_model, f, bias=c.ffn_bias) if c.ffn != "mlp" else None
        self.down = Linear(f, c.d_model, bias=c.ffn_bias)

    def forward(self, x: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        """(B, T, d) → (B, T, d); ``hooks`` unused: a dense FFN's points are the block's (``hook_mlp_out``)."""
        # (B, T, d) → (B, T, d_ff) → (B, T, d): act(x W_up), or act(x W_gate) ⊙ x W_up (SwiGLU)
        h = self.act(self.up(x)) if self.gate is None else self.act(self.gate(x)) * self.up(x)
        return self.down(h)
