"""A transformer from attnlab's parts, read top to bottom (after nanoGPT's model.py).

Embeddings and positions → L blocks (attention through :func:`attnlab.attention` by any backend,
then the feed-forward network, each with a residual sum and a norm) → the last hidden state.
The encoder (BERT, RoBERTa) puts the norm after each residual sum; the causal decoder (GPT-2,
Llama) before each sublayer, with a final norm. Rotary positions turn q and k; learned positions
are added to the input. Weights come from :mod:`attnlab.transformer.weights`.

Every intermediate tensor passes a named hook point (TransformerLens's names, attnlab's shapes:
:mod:`attnlab.transformer.hooks`, tabled in docs/design.md): :meth:`Transformer.run_with_cache`
hands them back, :meth:`Transformer.run_with_hooks` lets functions read or replace them. A hook
point nobody watches costs one set lookup, so the plain forward is the hooked one with no hooks.

torch is imported at module level: this file loads only when ``attnlab.transformer.Transformer``
is first used (the package resolves the name lazily), so ``import attnlab`` needs NumPy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.backends.api import attention
from attnlab.backends.request import repeat_groups
from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.hooks import WEIGHT_HOOKS, Hooks, build, hook_names

ACT = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu, "silu": F.silu}
# The backends whose math the model's own scores path is: the one a layer takes when its scores or
# pattern are hooked ("auto" then means "torch" for that layer).
EAGER_BACKENDS = ("torch", "auto")


@dataclass(frozen=True)
class Pass:
    """One forward pass as every layer sees it."""

    backend: str
    causal: bool
    positions: Any  # (T,) or (B, T) position of each token
    lengths: Any  # (B,) real tokens when padding is on the right, else None
    key_mask: Any  # (B, 1, 1, T) bool when the padding is elsewhere, else None
    hooks: Hooks

    def allowed(self, t: int, device: Any) -> Any:
        """Which keys each query may attend to, (B or 1, 1, T, T) bool, or None: every one."""
        keys = self.key_mask
        if self.lengths is not None:
            keys = (torch.arange(t, device=device) < self.lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
        if not self.causal:
            return keys
        tril = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # (T, T)
        return tril if keys is None else tril & keys


def norm(c: TransformerConfig) -> nn.Module:
    return nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.norm == "layernorm" else nn.RMSNorm(c.d_model, eps=c.norm_eps)


def normed(n: nn.Module, x: torch.Tensor, hooks: Hooks, at: str) -> torch.Tensor:
    """n(x); with ``{at}.hook_scale`` watched, by hand, so the scale (B, T, 1) can be read or replaced."""
    name = at + ".hook_scale"
    if not hooks.wants(name):
        return n(x)
    if isinstance(n, nn.LayerNorm):
        x = x - x.mean(-1, keepdim=True)  # (B, T, d): LayerNorm's scale is the centred input's RMS
    scale = hooks(name, (x.pow(2).mean(-1, keepdim=True) + n.eps).sqrt())  # (B, T, 1)
    y = x / scale * n.weight
    return y if getattr(n, "bias", None) is None else y + n.bias


def rotate(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary positions (Su et al. 2021, Llama's half-split layout): x (B, H, T, Dh), pos (T,) or (B, T)."""
    dh = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float32, device=x.device) / dh)  # (Dh/2,)
    angles = pos[..., None].float() * inv_freq  # (T, Dh/2) or (B, T, Dh/2)
    angles = torch.cat((angles, angles), dim=-1)  # (.., T, Dh)
    if angles.dim() == 3:
        angles = angles[:, None]  # (B, 1, T, Dh): broadcast over heads
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, c: TransformerConfig, at: str):
        super().__init__()
        self.c, self.at = c, at  # at: "blocks.{l}.attn.", the prefix of this layer's hook points
        self.q = nn.Linear(c.d_model, c.num_heads * c.head_dim, bias=c.bias)
        self.k = nn.Linear(c.d_model, c.heads_kv * c.head_dim, bias=c.bias)
        self.v = nn.Linear(c.d_model, c.heads_kv * c.head_dim, bias=c.bias)
        self.o = nn.Linear(c.num_heads * c.head_dim, c.d_model, bias=c.bias)

    def forward(self, x: torch.Tensor, p: Pass) -> torch.Tensor:
        c, h, at, (B, T, _) = self.c, p.hooks, self.at, x.shape
        # 1. project and split heads: (B, T, d) → (B, H, T, Dh); k and v may have fewer heads (GQA)
        q = h(at + "hook_q", self.q(x).view(B, T, c.num_heads, c.head_dim).transpose(1, 2))  # (B, H, T, Dh)
        k = h(at + "hook_k", self.k(x).view(B, T, c.heads_kv, c.head_dim).transpose(1, 2))  # (B, Hkv, T, Dh)
        v = h(at + "hook_v", self.v(x).view(B, T, c.heads_kv, c.head_dim).transpose(1, 2))  # (B, Hkv, T, Dh)
        # 2. rotary positions turn q and k by each token's position (relative positions in q·k)
        if c.positions == "rotary":
            q = h(at + "hook_rot_q", rotate(q, p.positions, c.rope_theta))
            k = h(at + "hook_rot_k", rotate(k, p.positions, c.rope_theta))
        # 3. attend: softmax(q kᵀ / √Dh) v → each head's output z (B, H, T, Dh); by attnlab's backend,
        #    or here, scores materialised, when a hook watches the scores or the pattern
        if h.wants(at + "hook_attn_scores") or h.wants(at + "hook_pattern"):
            z = attend_eager(q, k, v, p, at)
        else:
            z = attend(q, k, v, p)
        z = h(at + "hook_z", z)
        # 4. merge heads and project out: (B, H, T, Dh) → (B, T, H·Dh) → (B, T, d)
        return self.o(z.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass) -> torch.Tensor:
    """attnlab.attention on torch tensors; the float64 NumPy reference gets NumPy copies (no gradients)."""
    kw = dict(causal=p.causal, mask=p.key_mask, lengths=p.lengths, backend=p.backend)
    if p.backend == "numpy":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError("backend 'numpy' computes on float64 NumPy copies, without gradients; run under "
                             "torch.no_grad() or choose a backend with gradients (torch, blockwise, kernel)")
        arrays = [t.detach().cpu().double().numpy() for t in (q, k, v)]
        mask = None if p.key_mask is None else p.key_mask.cpu().numpy()
        out = attention(*arrays, **dict(kw, mask=mask))
        return torch.from_numpy(out).to(device=q.device, dtype=q.dtype)
    return attention(q, k, v, **kw)


def attend_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass, at: str) -> torch.Tensor:
    """Backend "torch"'s math written out, so ``hook_attn_scores`` (after scale and mask, before the
    softmax) and ``hook_pattern`` can read or replace the scores and weights (B, H, T, T); z = pattern · v."""
    g = q.shape[1] // k.shape[1]
    k, v = repeat_groups(k, g), repeat_groups(v, g)  # (B, H, T, Dh): each query head's k/v head
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, T, T)
    allowed = p.allowed(q.shape[2], q.device)  # (B or 1, 1, T, T) or None
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    s = p.hooks(at + "hook_attn_scores", s)
    w = p.hooks(at + "hook_pattern", torch.softmax(s, dim=-1).nan_to_num(nan=0.0))  # a row with no key: zeros
    return torch.matmul(w, v)  # (B, H, T, Dh)


class FeedForward(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.act = ACT[c.activation]
        self.up = nn.Linear(c.d_model, c.hidden_ff, bias=c.ffn_bias)
        self.gate = nn.Linear(c.d_model, c.hidden_ff, bias=c.ffn_bias) if c.ffn == "gated" else None
        self.down = nn.Linear(c.hidden_ff, c.d_model, bias=c.ffn_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, d) → (B, T, d_ff) → (B, T, d): act(x W_up), or act(x W_gate) ⊙ x W_up (SwiGLU)
        h = self.act(self.up(x)) if self.gate is None else self.act(self.gate(x)) * self.up(x)
        return self.down(h)


class Block(nn.Module):
    def __init__(self, c: TransformerConfig, layer: int):
        super().__init__()
        self.post, self.at = c.post_norm, f"blocks.{layer}."
        self.attn, self.norm1 = Attention(c, self.at + "attn."), norm(c)
        self.ffn = FeedForward(c) if c.ffn != "none" else None
        self.norm2 = norm(c) if self.ffn is not None else None

    def forward(self, x: torch.Tensor, p: Pass) -> torch.Tensor:
        h, at = p.hooks, self.at
        x = h(at + "hook_resid_pre", x)  # (B, T, d)
        if self.post:  # BERT: x = norm(x + sublayer(x)); the sums are hooked before their norm
            a = h(at + "hook_attn_out", self.attn(x, p))
            if self.ffn is None:
                x = normed(self.norm1, h(at + "hook_resid_post", x + a), h, at + "ln1")
                return h(at + "hook_normalized_resid_post", x)
            x = normed(self.norm1, h(at + "hook_resid_mid", x + a), h, at + "ln1")
            m = h(at + "hook_mlp_out", self.ffn(x))
            x = normed(self.norm2, h(at + "hook_resid_post", x + m), h, at + "ln2")
            return h(at + "hook_normalized_resid_post", x)
        # GPT-2, Llama: x = x + sublayer(norm(x))
        a = h(at + "hook_attn_out", self.attn(normed(self.norm1, x, h, at + "ln1"), p))
        if self.ffn is None:
            return h(at + "hook_resid_post", x + a)
        x = h(at + "hook_resid_mid", x + a)
        m = h(at + "hook_mlp_out", self.ffn(normed(self.norm2, x, h, at + "ln2")))
        return h(at + "hook_resid_post", x + m)


class Transformer(nn.Module):
    """The whole model: ``m(input_ids, attention_mask)`` → the last hidden state [B, T, d].

    ``backend`` (default "auto") is the attention backend of every layer; a call may override it.
    Built from a config it has random weights; :meth:`from_pretrained` loads real ones.
    """

    def __init__(self, config: TransformerConfig, backend: str = "auto"):
        super().__init__()
        c = self.config = config
        self.backend = backend
        self.tokenizer: Any = None  # set by from_pretrained
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.max_positions, c.d_model) if c.positions == "learned" else None
        self.type_emb = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        self.emb_norm = norm(c) if c.embed_norm else None
        self.blocks = nn.ModuleList(Block(c, layer) for layer in range(c.num_layers))
        self.final_norm = None if c.post_norm else norm(c)
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)

    @classmethod
    def from_pretrained(cls, model: Any = None, backend: str = "auto", revision: str | None = None) -> Transformer:
        """Weights from safetensors: the bundled default (``None``), a folder or a hub id."""
        from attnlab.transformer.weights import load_pretrained

        return load_pretrained(cls, model, backend=backend, revision=revision)

    def hook_names(self) -> tuple[str, ...]:
        """Every hook point of this model, in the order they fire."""
        return hook_names(self.config)

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, *,
                backend: str | None = None) -> torch.Tensor:
        """The last hidden state [B, T, d] (no hooks)."""
        return self._forward(input_ids, attention_mask, backend, Hooks())

    def run_with_hooks(self, input_ids: torch.Tensor, attention_mask: Any = None, *, fwd_hooks: Any = (),
                       backend: str | None = None) -> torch.Tensor:
        """Logits [B, T, V] (a causal LM) or the last hidden state [B, T, d] (an encoder), with
        ``fwd_hooks`` [(name, fn), …] run at their hook points: ``fn(tensor, name)`` returns None or a
        replacement of the same shape (several at one name run in order, each on the last's result)."""
        return self._output(self._forward(input_ids, attention_mask, backend, build(self.config, fwd_hooks)))

    def run_with_cache(self, input_ids: torch.Tensor, attention_mask: Any = None, *, names: Any = None,
                       fwd_hooks: Any = (), backend: str | None = None) -> tuple[torch.Tensor, dict]:
        """(what :meth:`run_with_hooks` returns, {hook name: tensor}): the tensors of ``names`` (a list,
        a predicate on the name, or None: every hook point), detached, after any ``fwd_hooks`` replaced them."""
        hooks = build(self.config, fwd_hooks, names)
        out = self._output(self._forward(input_ids, attention_mask, backend, hooks))
        return out, hooks.cache

    def _output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden) if self.config.causal else hidden

    def _forward(self, input_ids: Any, attention_mask: Any, backend: str | None, hooks: Hooks) -> torch.Tensor:
        c, h, ids = self.config, hooks, torch.as_tensor(input_ids)
        if ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(ids.shape)}")
        B, T = ids.shape
        mask = None if attention_mask is None else torch.as_tensor(attention_mask, device=ids.device).bool()
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"attention_mask must have input_ids' shape {(B, T)}, got {tuple(mask.shape)}")
        backend = backend or self.backend
        eager = sorted(n for n in h.watched if n.endswith(WEIGHT_HOOKS))
        if eager and backend not in EAGER_BACKENDS:
            raise ValueError(f"hook {eager[0]} needs the attention scores materialised, which the model computes "
                             f"with backend 'torch''s math; got backend {backend!r}: pass backend 'torch' or 'auto'")
        # 1. which keys are padding: lengths when it is on the right (every backend serves it), else a mask
        arange = torch.arange(T, device=ids.device)  # (T,)
        lengths = key_mask = None
        if mask is not None and not bool(mask.all()):
            n = mask.sum(-1)  # (B,)
            right = bool((mask == (arange[None] < n[:, None])).all())
            lengths, key_mask = (n, None) if right else (None, mask[:, None, None, :])  # (B, 1, 1, T)
        # 2. positions: 0..T-1, or RoBERTa's count of real tokens after the pad id
        pos = arange
        if c.position_offset:
            real = ids.ne(c.pad_token_id).long()  # (B, T)
            pos = real.cumsum(-1) * real + c.pad_token_id
        p = Pass(backend=backend, causal=c.causal, positions=pos, lengths=lengths, key_mask=key_mask, hooks=h)
        # 3. embed: token (+ learned position + segment 0) → (B, T, d), normed in BERT
        x = h("hook_embed", self.tok_emb(ids))  # (B, T, d)
        if self.pos_emb is not None:
            x = x + h("hook_pos_embed", self.pos_emb(pos).expand(B, T, -1))  # (T or B, T, d) → (B, T, d)
        if self.type_emb is not None:
            x = x + h("hook_token_type_embed", self.type_emb.weight[0].expand(B, T, -1))  # (d,) → (B, T, d)
        if self.emb_norm is not None:
            x = normed(self.emb_norm, x, h, "embed.ln")
        # 4. the blocks, each (B, T, d) → (B, T, d)
        for block in self.blocks:
            x = block(x, p)
        # 5. the final norm of pre-norm models
        if self.final_norm is not None:
            x = normed(self.final_norm, x, h, "ln_final")
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token scores [B, T, V] from the last hidden state (the tied embeddings or the LM head)."""
        if not self.config.causal:
            raise ValueError(f"logits need a causal language model, got a {self.config.family} encoder")
        return hidden @ self.tok_emb.weight.T if self.lm_head is None else self.lm_head(hidden)

    def embed(self, sentences: list[str] | str, batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings [N, d]: the mean of the last hidden state over real tokens, L2-normalised
        (what all-MiniLM-L6-v2 is trained for)."""
        if self.tokenizer is None:
            raise ValueError("embed needs a tokenizer: load the model with Transformer.from_pretrained")
        sentences = [sentences] if isinstance(sentences, str) else list(sentences)
        out = []
        for i in range(0, len(sentences), batch_size):
            enc = self.tokenizer(sentences[i:i + batch_size], padding=True, truncation=True, return_tensors="pt",
                                 max_length=self.config.max_positions - self.config.position_offset)
            mask = enc["attention_mask"]  # (b, T)
            with torch.no_grad():
                h = self(enc["input_ids"], mask)  # (b, T, d)
            m = mask[..., None].to(h.dtype)  # (b, T, 1)
            out.append(F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1), dim=-1))  # (b, d)
        return torch.cat(out)
