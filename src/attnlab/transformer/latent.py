"""Multi-head latent attention (DeepSeek-V2/V3's MLA) in attnlab's transformer: :class:`LatentAttention`,
a block's attention when its config has a :class:`~attnlab.transformer.shapes.Latent`.

Every token gives one latent c = RMSNorm(W_DKV x) of ``kv_rank`` and one rotary key k_r of ``rope_dim``,
shared by all heads; head h's key is (W_UK,h c, k_r) and its value W_UV,h c (the two up-projections
are the rows of ``kv_b``, transformers' kv_b_proj). Its query is (q_nope, q_rope) of nope_dim + rope_dim,
from one projection or through the low rank ``q_rank`` with its own RMSNorm. Rotary turns q_rope and
k_r only (in adjacent pairs when ``interleave``, as DeepSeek's weights are laid out).

Two ways to compute one thing:

- **expanded** (the plain forward: prefill, maps, hooks): the per-head keys and values are formed and
  attended as any model's, (B, H, T, nope + rope) and (B, H, T, v_dim).
- **latent** (decoding with a cache; DeepSeek's inference code): W_UK is absorbed into the query,
  q_h' = (W_UK,hᵀ q_nope,h, q_rope,h) of kv_rank + rope_dim, so that q_h'·(c_j, k_r,j) = q_h·k_h,j; the
  query heads attend to the cache's rows (c, k_r) as one shared k/v head (``attnlab.attention`` with
  H query heads over one k/v head), and W_UV is applied after attention to each head's weighted sum of
  the latents. The cache holds c and k_r only (:class:`~attnlab.transformer.latent_cache.LatentCache`).
  The scores are the same numbers summed in another order, so both agree to rounding (tested in float64).

Hook points (TransformerLens has no MLA; attnlab's names): ``attn.hook_q`` (B, H, T, nope + rope) before
rotary, ``attn.hook_latent`` (B, 1, T, kv_rank) the normed latent (what the cache keeps beside k_r),
``attn.hook_rot_q`` (B, H, T, rope_dim) and ``attn.hook_rot_k`` (B, 1, T, rope_dim) the rotary parts after
rotary, then scores, pattern, ``hook_z`` (B, H, T, v_dim) as every attention's.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.transformer.attend import Pass, attend, attend_eager
from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.hooks import Hooks
from attnlab.transformer.linear import Linear
from attnlab.transformer.rotary import rotate

NORM_EPS = 1e-6  # transformers' DeepseekV3RMSNorm default: q_a_layernorm and kv_a_layernorm do not take rms_norm_eps


def pairs_to_halves(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, …) → (x0, x2, …, x1, x3, …): DeepSeek's interleaved rotary pairs in Llama's halves
    (the same permutation of q's and k's dims: their dot product is unchanged)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class LatentAttention(nn.Module):
    def __init__(self, c: TransformerConfig, layer: int):
        super().__init__()
        a, H, d = c.latent, c.num_heads, c.d_model
        self.c, self.lat, self.layer, self.at = c, a, layer, f"blocks.{layer}.attn."
        if a.q_rank is None:
            self.q = Linear(d, H * a.qk_dim, bias=False)
        else:  # down to q_rank, RMS-normed, up
            self.q_a = Linear(d, a.q_rank, bias=c.bias)
            self.q_a_norm = nn.RMSNorm(a.q_rank, eps=NORM_EPS)
            self.q_b = Linear(a.q_rank, H * a.qk_dim, bias=False)
        self.kv_a = Linear(d, a.cached, bias=c.bias)  # x → (c before its norm, k_r)
        self.kv_norm = nn.RMSNorm(a.kv_rank, eps=NORM_EPS)
        self.kv_b = Linear(a.kv_rank, H * (a.nope_dim + a.v_dim), bias=False)  # c → every head's (k_nope, v)
        self.o = Linear(H * a.v_dim, d, bias=c.bias)

    def forward(self, x: torch.Tensor, p: Pass) -> torch.Tensor:
        a, h, at, H, (B, T, _) = self.lat, p.hooks, self.at, self.c.num_heads, x.shape
        # 1. queries (B, T, d) → (B, H, T, nope + rope), split into their nope and rotary parts
        q = self.q(x) if self.lat.q_rank is None else self.q_b(self.q_a_norm(self.q_a(x)))
        q = h(at + "hook_q", q.view(B, T, H, a.qk_dim).transpose(1, 2))  # (B, H, T, nope + rope)
        q_nope, q_rope = q.split([a.nope_dim, a.rope_dim], dim=-1)
        # 2. the latent (B, 1, T, kv_rank), normed, and the rotary key shared by every head (B, 1, T, rope)
        c_kv, k_rope = self.kv_a(x).split([a.kv_rank, a.rope_dim], dim=-1)  # (B, T, ·) each
        c_kv = h(at + "hook_latent", self.kv_norm(c_kv)[:, None])  # (B, 1, T, kv_rank)
        k_rope = k_rope[:, None]  # (B, 1, T, rope)
        # 3. rotary turns the rotary parts only (DeepSeek's adjacent pairs laid out as halves first)
        if a.interleave:
            q_rope, k_rope = pairs_to_halves(q_rope), pairs_to_halves(k_rope)
        q_rope = h(at + "hook_rot_q", rotate(q_rope, p.rope))  # (B, H, T, rope)
        k_rope = h(at + "hook_rot_k", rotate(k_rope, p.rope))  # (B, 1, T, rope)
        # 4. attend: expanded (plain pass) or in the latent space against the cache (decoding)
        if p.kv is None:
            z = self._expanded(q_nope, q_rope, c_kv, k_rope, p)
        else:
            z = self._latent(q_nope, q_rope, torch.cat((c_kv, k_rope), dim=-1), p)
        z = h(at + "hook_z", z)  # (B, H, T, v_dim)
        # 5. merge heads and project out: (B, H, T, v) → (B, T, H·v) → (B, T, d)
        return self.o(z.transpose(1, 2).reshape(B, T, H * a.v_dim))

    def up(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK (H, nope, kv_rank) and W_UV (H, v_dim, kv_rank): the rows of kv_b, per head."""
        a = self.lat
        w = self.kv_b.weight.view(self.c.num_heads, a.nope_dim + a.v_dim, a.kv_rank)  # (H·(n + v), r) → (H, n + v, r)
        return w[:, : a.nope_dim], w[:, a.nope_dim:]

    def expand(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's keys (B, H, T, nope + rope) and values (B, H, T, v) from the latents (B, 1, T, r) and the
        rotary keys (B, 1, T, rope)."""
        a, H, (B, _, T, _) = self.lat, self.c.num_heads, c_kv.shape
        kv = self.kv_b(c_kv[:, 0]).view(B, T, H, a.nope_dim + a.v_dim).transpose(1, 2)  # (B, H, T, n + v)
        k_nope, v = kv.split([a.nope_dim, a.v_dim], dim=-1)
        return torch.cat((k_nope, k_rope.expand(B, H, T, a.rope_dim)), dim=-1), v

    def _expanded(self, q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
                  p: Pass) -> torch.Tensor:
        k, v = self.expand(c_kv, k_rope)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, H, T, nope + rope)
        z = _attend(q, k, v, p, self.at, p.visibility(None))
        return z  # (B, H, T, v)

    def _latent(self, q_nope: torch.Tensor, q_rope: torch.Tensor, rows: torch.Tensor, p: Pass) -> torch.Tensor:
        """Decoding: ``rows`` (B, 1, T, r + rope) appended to the cache; the query heads attend to its rows."""
        w_uk, w_uv = self.up()
        q = torch.cat((torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk), q_rope), dim=-1)  # (B, H, T, r + rope)
        read = p.kv.update(self.layer, p.step, rows, rows, q.dtype)
        z = _attend(q, read.k, read.v, p, self.at, read.kwargs(), read)  # (B, H, T, r + rope): v is the rows
        return torch.einsum("bhtr,hvr->bhtv", z[..., : self.lat.kv_rank], w_uv)  # (B, H, T, v)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass, at: str, kw: dict, read=None) -> torch.Tensor:
    """One attention call as :class:`~attnlab.transformer.model.Attention` makes it (eager where the scores or
    the pattern are hooked; the newest row kept for ``hook_last_pattern``, in position order)."""
    h: Hooks = p.hooks
    last = h.wants(at + "hook_last_pattern")
    if h.wants(at + "hook_attn_scores") or h.wants(at + "hook_pattern"):
        z, row = attend_eager(q, k, v, p, at, kw, last)
    else:
        z, row = attend(q, k, v, p, kw, last)
    if last:
        h(at + "hook_last_pattern", row if read is None else read.by_position(row, p.step.longest))
    return z
