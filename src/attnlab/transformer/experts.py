"""gpt-oss's mixture of experts (:class:`Experts`): the feed-forward network of a block whose config
has ``ffn="experts"``. A router picks each token's experts; the (token, choice) pairs are grouped by
expert with one stable sort, so a batch runs every chosen expert once, on its own tokens, as
transformers' eager loop and the grouped kernels of serving stacks do, never every expert on every
token. Its hook points are TransformerLens's MoE names and meanings: ``blocks.{l}.mlp.hook_expert_weights``,
the router's softmax over every expert before the top-k (B, T, E), and ``hook_expert_indices``, the
chosen experts (B, T, k)."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.hooks import Hooks
from attnlab.transformer.linear import Linear


class Experts(nn.Module):
    """gpt-oss's mixture of experts: a router (with bias) picks ``experts_per_token`` of ``num_experts`` for
    each token, a softmax over the chosen logits weighs their outputs, and each expert is a SwiGLU with
    biases whose gate and up are clamped at ``swiglu_limit``: (up + 1) · gate · σ(α · gate). Every expert
    runs once, on the tokens routed to it (never every expert on every token)."""

    def __init__(self, c: TransformerConfig, layer: int):
        super().__init__()
        E, d, f = c.num_experts, c.d_model, c.hidden_ff
        self.k, self.limit, self.alpha, self.at = c.experts_per_token, c.swiglu_limit, c.swiglu_alpha, f"blocks.{layer}.mlp."
        self.router = Linear(d, E, bias=True)
        self.gate, self.gate_bias = nn.Parameter(torch.zeros(E, d, f)), nn.Parameter(torch.zeros(E, f))
        self.up, self.up_bias = nn.Parameter(torch.zeros(E, d, f)), nn.Parameter(torch.zeros(E, f))
        self.down, self.down_bias = nn.Parameter(torch.zeros(E, f, d)), nn.Parameter(torch.zeros(E, d))
        with torch.no_grad():  # random as a Linear's, so that a model built from a config routes and computes
            for w, fan_in in ((self.gate, d), (self.up, d), (self.down, f)):
                w.normal_(0.0, fan_in ** -0.5)

    def forward(self, x: torch.Tensor, hooks: Hooks) -> torch.Tensor:
        B, T, d = x.shape
        # 1. route as TransformerLens's MoE hooks it: the softmax over every expert (B, T, E), its k largest
        #    renormalised (= gpt-oss's softmax over the k largest logits) → weights and expert ids (B, T, k)
        probs = hooks(self.at + "hook_expert_weights", self.router(x).softmax(-1))  # (B, T, E)
        top, chosen = probs.topk(self.k, dim=-1)  # (B, T, k) each
        weights = top / top.sum(-1, keepdim=True)
        chosen = hooks(self.at + "hook_expert_indices", chosen)  # (B, T, k) expert ids
        # 2. each chosen expert once, on its tokens → (B, T, d)
        return run_each(x, weights, chosen, self.gate.shape[0], self._expert, self.at)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on its tokens (n, d) → (n, d)."""
        gate = (x @ self.gate[e] + self.gate_bias[e]).clamp(max=self.limit)  # (n, f)
        up = (x @ self.up[e] + self.up_bias[e]).clamp(min=-self.limit, max=self.limit)  # (n, f)
        return ((up + 1) * gate * torch.sigmoid(self.alpha * gate)) @ self.down[e] + self.down_bias[e]


def run_each(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, experts: int, expert, at: str) -> torch.Tensor:
    """Σ over each token's chosen experts of weight · expert(token): x (B, T, d), weights and ``chosen``
    expert ids (B, T, k) → (B, T, d). The (token, choice) pairs are grouped by expert with one stable
    sort, and ``expert(e, rows (n, d)) → (n, d)`` runs once per expert chosen, on its tokens only."""
    B, T, d = x.shape
    k = chosen.shape[-1]
    check_chosen(chosen, experts, at)
    flat, w, e = x.reshape(B * T, d), weights.reshape(-1), chosen.reshape(-1)  # (N, d), (N·k,), (N·k,)
    order = e.argsort(stable=True)  # (N·k,)
    counts = torch.bincount(e, minlength=experts).tolist()
    parts, start = [], 0
    for expert_id, n in enumerate(counts):
        if n:
            parts.append(expert(expert_id, flat[order[start:start + n] // k]))  # (n, d): this expert on its tokens
        start += n
    # back to (token, choice) order by the inverse permutation (a gather: torch's index_add_ on the CPU took
    # milliseconds even for the one row of a decoding step), weighed, and each token's k outputs summed
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    out = torch.cat(parts)[back] * w[:, None].to(flat.dtype)  # (N·k, d)
    return out.view(B, T, k, d).sum(2)


def check_chosen(chosen: torch.Tensor, experts: int, at: str) -> None:
    """The chosen ids (after their hook) are expert ids: else a ValueError naming the hook."""
    if chosen.dtype != torch.long or bool(((chosen < 0) | (chosen >= experts)).any()):
        raise ValueError(f"{at}hook_expert_indices must hold expert ids (long) in 0..{experts - 1}, got "
                         f"{chosen.dtype} in {int(chosen.min())}..{int(chosen.max())}")
