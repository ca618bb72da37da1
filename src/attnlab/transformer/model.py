"""A transformer from attnlab's parts, read top to bottom (after nanoGPT's model.py).

Embeddings and positions → L blocks (attention through :func:`attnlab.attention` by any backend,
then the feed-forward network, each with a residual sum and a norm) → the last hidden state.
The encoder (BERT, RoBERTa) puts the norm after each residual sum; the causal decoder (GPT-2,
Llama) before each sublayer, with a final norm. Rotary positions turn q and k; learned positions
are added to the input. Weights come from :mod:`attnlab.transformer.weights`.

Heads can be knocked out: ``keep`` [L, H] (or [B, L, H], one per sequence) multiplies each head's
output (0: out, 1: in; its gradient is the head importance of Michel et al. 2019) and ``fill`` [L, H, Dh] takes the place of
what is taken out (zeros, or each head's mean output for a mean ablation).

torch is imported at module level: this file loads only when ``attnlab.transformer.Transformer``
is first used (the package resolves the name lazily), so ``import attnlab`` needs NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.backends.api import attention
from attnlab.transformer.config import TransformerConfig

ACT = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu, "silu": F.silu}


@dataclass(frozen=True)
class Trace:
    """One forward pass: ``hidden`` [B, T, d]; per layer, when asked, the attention ``weights``
    [B, H, T, T] and each head's output before the output projection, ``heads`` [B, H, T, Dh]."""

    hidden: Any
    weights: tuple | None = None
    heads: tuple | None = None


@dataclass(frozen=True)
class Pass:
    """What every layer of one forward pass shares."""

    backend: str
    causal: bool
    positions: Any  # (T,) or (B, T) position of each token
    lengths: Any  # (B,) real tokens when padding is on the right, else None
    key_mask: Any  # (B, 1, 1, T) bool when the padding is elsewhere, else None
    keep: Any  # [L, H] or None
    fill: Any  # [L, H, Dh] or None
    weights: bool
    heads: bool


def mean_pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``h`` (B, T, d) over each sequence's real tokens (``mask`` (B, T), 1 = real) → (B, d);
    a sequence with none gives zeros (the divisor is clamped to 1), never NaN."""
    m = mask[..., None].to(h.dtype)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1)


def norm(c: TransformerConfig) -> nn.Module:
    return nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.norm == "layernorm" else nn.RMSNorm(c.d_model, eps=c.norm_eps)


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
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.c = c
        self.q = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=c.bias)
        self.k = nn.Linear(c.d_model, c.heads_kv * c.head_dim, bias=c.bias)
        self.v = nn.Linear(c.d_model, c.heads_kv * c.head_dim, bias=c.bias)
        self.o = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=c.bias)

    def forward(self, x: torch.Tensor, p: Pass, layer: int) -> tuple:
        c, (B, T, _) = self.c, x.shape
        # 1. project and split heads: (B, T, d) → (B, H, T, Dh); k and v may have fewer heads (GQA)
        q = self.q(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, c.heads_kv, c.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = self.v(x).view(B, T, c.heads_kv, c.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        # 2. rotary positions turn q and k by each token's position (relative positions in q·k)
        if c.positions == "rotary":
            q, k = rotate(q, p.positions, c.rope_theta), rotate(k, p.positions, c.rope_theta)
        # 3. attend: softmax(q kᵀ / √Dh) v by attnlab's backend → (B, H, T, Dh), weights (B, H, T, T)
        y, w = attend(q, k, v, p)
        # 4. knock heads out: keep·y + (1 − keep)·fill, per head
        if p.keep is not None:
            keep = p.keep[..., layer, :].to(y.dtype).reshape(-1, c.n_heads, 1, 1)  # (1 or B, H, 1, 1)
            fill = 0.0 if p.fill is None else p.fill[layer].to(y.dtype)[None, :, None, :]  # (1, H, 1, Dh)
            y = keep * y + (1 - keep) * fill
        heads = y if p.heads else None
        # 5. merge heads and project out: (B, H, T, Dh) → (B, T, H·Dh) → (B, T, d)
        y = y.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim)
        return self.o(y), w, heads


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Pass) -> tuple:
    """attnlab.attention on torch tensors; the float64 NumPy reference gets NumPy copies (no gradients)."""
    kw = dict(causal=p.causal, mask=p.key_mask, lengths=p.lengths, return_weights=p.weights, backend=p.backend)
    if p.backend == "numpy":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError("backend 'numpy' computes on float64 NumPy copies, without gradients; run under "
                             "torch.no_grad() or choose a backend with gradients (torch, blockwise, kernel)")
        arrays = [t.detach().cpu().double().numpy() for t in (q, k, v)]
        mask = None if p.key_mask is None else p.key_mask.cpu().numpy()
        out = attention(*arrays, **dict(kw, mask=mask))
        out = out if isinstance(out, tuple) else (out,)
        back = [torch.from_numpy(o).to(device=q.device, dtype=q.dtype) for o in out]
        return back[0], (back[1] if p.weights else None)
    out = attention(q, k, v, **kw)
    return (out[0], out[1]) if p.weights else (out, None)


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
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.post = c.post_norm
        self.attn, self.norm1 = Attention(c), norm(c)
        self.ffn = FeedForward(c) if c.ffn != "none" else None
        self.norm2 = norm(c) if self.ffn is not None else None

    def forward(self, x: torch.Tensor, p: Pass, layer: int) -> tuple:
        if self.post:  # BERT: x = norm(x + sublayer(x))
            a, w, heads = self.attn(x, p, layer)
            x = self.norm1(x + a)
            return (x if self.ffn is None else self.norm2(x + self.ffn(x))), w, heads
        a, w, heads = self.attn(self.norm1(x), p, layer)  # GPT-2, Llama: x = x + sublayer(norm(x))
        x = x + a
        return (x if self.ffn is None else x + self.ffn(self.norm2(x))), w, heads


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
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.final_norm = None if c.post_norm else norm(c)
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)

    @classmethod
    def from_pretrained(cls, model: Any = None, backend: str = "auto", revision: str | None = None) -> Transformer:
        """Weights from safetensors: the bundled default (``None``), a folder or a hub id."""
        from attnlab.transformer.weights import load_pretrained

        return load_pretrained(cls, model, backend=backend, revision=revision)

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, **kw: Any) -> torch.Tensor:
        """Last hidden state [B, T, d]; ``kw`` as :meth:`trace` takes them."""
        return self.trace(input_ids, attention_mask, **kw).hidden

    def trace(self, input_ids: torch.Tensor, attention_mask: Any = None, *, backend: str | None = None,
              keep: Any = None, fill: Any = None, weights: bool = False, heads: bool = False) -> Trace:
        """A forward pass that can also hand back each layer's ``weights`` and ``heads`` (see :class:`Trace`)."""
        c, ids = self.config, torch.as_tensor(input_ids)
        if ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(ids.shape)}")
        B, T = ids.shape
        mask = None if attention_mask is None else torch.as_tensor(attention_mask, device=ids.device).bool()
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"attention_mask must have input_ids' shape {(B, T)}, got {tuple(mask.shape)}")
        if keep is not None and tuple(keep.shape) not in ((c.n_layers, c.n_heads), (B, c.n_layers, c.n_heads)):
            raise ValueError(f"keep must be [L, H] = {[c.n_layers, c.n_heads]} or [B, L, H], got {list(keep.shape)}")
        if fill is not None and tuple(fill.shape) != (c.n_layers, c.n_heads, c.head_dim):
            raise ValueError(f"fill must be [L, H, Dh] = {[c.n_layers, c.n_heads, c.head_dim]}, got {list(fill.shape)}")
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
        p = Pass(backend or self.backend, c.causal, pos, lengths, key_mask, keep, fill, weights, heads)
        # 3. embed: token (+ learned position + segment 0) → (B, T, d), normed in BERT
        x = self.tok_emb(ids)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        if self.type_emb is not None:
            x = x + self.type_emb.weight[0]
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        # 4. the blocks, each (B, T, d) → (B, T, d)
        ws, hs = [], []
        for layer, block in enumerate(self.blocks):
            x, w, h = block(x, p, layer)
            ws.append(w)
            hs.append(h)
        # 5. the final norm of pre-norm models
        if self.final_norm is not None:
            x = self.final_norm(x)
        return Trace(x, tuple(ws) if weights else None, tuple(hs) if heads else None)

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
            out.append(F.normalize(mean_pool(h, mask), dim=-1))  # (b, d)
        return torch.cat(out)
