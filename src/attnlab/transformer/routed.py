"""The routed SwiGLU experts of DeepSeek-V3 and Qwen3-MoE (:class:`RoutedExperts`, the FFN of a block whose
config has a :class:`~attnlab.transformer.shapes.Routing`), and :func:`mixture`, which FFN a layer of a
mixture-of-experts model has: gpt-oss's experts, these, or (a routing's dense layer) a dense SwiGLU.

The router scores every expert (softmax or sigmoid), the choice may add DeepSeek's correction bias and
keep only the best groups of experts, and the chosen experts weigh by their scores, renormalised and
scaled as the routing says; every chosen expert runs once, on its own tokens
(:func:`~attnlab.transformer.experts.run_each`), never every expert on every token. A shared expert
(DeepSeek-V3) adds its SwiGLU of every token. Hook points as gpt-oss's: ``blocks.{l}.mlp.hook_expert_weights``
is the router's score of every expert before the choice (B, T, E) (sigmoid scores for DeepSeek-V3: they do
not add up to 1), ``hook_expert_indices`` the k chosen (B, T, k); replacing either reroutes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.experts import Experts, check_chosen, run_each
from attnlab.transformer.ffn import FeedForward
from attnlab.transformer.hooks import Hooks


def mixture(c: TransformerConfig, layer: int) -> nn.Module:
    """Layer ``layer``'s FFN in a model with ``ffn="experts"``: a dense SwiGLU of d_ff on the routing's dense
    layers, gpt-oss's clamped experts without a routing, else :class:`RoutedExperts`."""
    if not c.routed(layer):
        return FeedForward(c)
    return Experts(c, layer) if c.routing is None else RoutedExperts(c, layer)


class RoutedExperts(nn.Module):
    """``num_experts`` SwiGLU experts of width ``routing.d_ff`` (transformers' layout: ``gate_up`` (E, 2f, d),
    gate's rows first, ``down`` (E, d, f)), a router without bias, DeepSeek's ``score_bias`` (E,) for the
    choice only, and a shared expert when ``routing.shared_d_ff``."""

    def __init__(self, c: TransformerConfig, layer: int):
        super().__init__()
        r, E, d = c.routing, c.num_experts, c.d_model
        self.routing, self.k, self.at = r, c.experts_per_token, f"blocks.{layer}.mlp."
        self.router = nn.Parameter(torch.zeros(E, d))
        self.score_bias = nn.Parameter(torch.zeros(E)) if r.score_bias else None
        self.gate_up = nn.Parameter(torch.zeros(E, 2 * r.d_ff, d))
        self.down = nn.Parameter(torch.zeros(E, d, r.d_ff))
        self.shared = FeedForward(c, r.shared_d_ff) if r.shared_d_ff else None
        with torch.no_grad():  # random as a Linear's, so that a model built from a config routes and computes
            for w, fan_in in ((self.router, d), (self.gate_up, d), (self.down, r.d_ff)):
                w.normal_(0.0, fan_in ** -0.5)

    def forward(self, x: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        """(B, T, d) → (B, T, d)."""
        r = self.routing
        # 1. the router's score of every expert (B, T, E), in float32 at least (as transformers' router)
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        logits = F.linear(wide, self.router.to(wide.dtype))  # (B, T, E)
        scores = hooks(self.at + "hook_expert_weights", logits.softmax(-1) if r.score == "softmax" else logits.sigmoid())
        # 2. the choice (B, T, k): the k best (with the correction bias) among the best groups
        chosen = hooks(self.at + "hook_expert_indices", self._choose(scores))
        check_chosen(chosen, scores.shape[-1], self.at)
        # 3. their weights (B, T, k): the scores, renormalised (norm_topk_prob), times routed_scaling_factor
        weights = scores.gather(-1, chosen)
        if r.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if r.score == "sigmoid" else 0.0))
        weights = weights * r.scale
        # 4. each chosen expert once, on its tokens; plus the shared expert on every token
        out = run_each(x, weights, chosen, scores.shape[-1], self._expert, self.at)
        return out if self.shared is None else out + self.shared(x, hooks)

    def _choose(self, scores: torch.Tensor) -> torch.Tensor:
        """The k experts of each token (B, T, k): by score (+ the correction bias), within the ``top_groups``
        groups whose two best experts score highest (DeepSeek's group-limited routing)."""
        r = self.routing
        pick = scores if self.score_bias is None else scores + self.score_bias.to(scores.dtype)  # (B, T, E)
        if r.groups > 1:
            grouped = pick.unflatten(-1, (r.groups, -1))  # (B, T, G, E / G)
            best = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)  # (B, T, G)
            keep = torch.zeros_like(best, dtype=torch.bool).scatter_(-1, best.topk(r.top_groups, dim=-1).indices, True)
            pick = pick.masked_fill(~keep[..., None].expand_as(grouped).flatten(-2), float("-inf"))
        return pick.topk(self.k, dim=-1).indices

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on its tokens (n, d) → (n, d): down(silu(gate x) · up x)."""
        gate, up = F.linear(x, self.gate_up[e]).chunk(2, dim=-1)  # (n, f) each
        return F.linear(F.silu(gate) * up, self.down[e])
