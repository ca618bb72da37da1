"""A transformer from attnlab's parts, read top to bottom (after nanoGPT's model.py).

Embeddings and positions → L blocks (attention through :func:`attnlab.attention` by any backend,
then the feed-forward network, each with a residual sum and a norm) → the last hidden state.
The encoder (BERT, RoBERTa) puts the norm after each residual sum; the causal decoders (GPT-2,
Llama, Mistral, Qwen2, Gemma-2, Qwen3, Gemma-3, gpt-oss) before each sublayer, with a final norm
(Gemma-2 and -3 also after each sublayer). Rotary positions turn q and k (after QK-norm in Qwen3 and
Gemma-3; Gemma-3's sliding layers by their own base); learned positions are added to the input. A
layer may have a sliding window (its ``layer_window``), softcapped scores and learned sinks (gpt-oss);
the feed-forward network may be routed experts (gpt-oss, :class:`Experts`). Weights come from
:mod:`attnlab.transformer.weights`, in any float dtype.

**Decoding** goes through the same forward: ``kv_cache=`` (a :class:`~attnlab.transformer.cache.KVCache`)
makes ``input_ids`` the new tokens after what the cache holds, their positions each sequence's own
(the cache's lengths on), their keys and values appended, and every layer's attention read the
cache through ``lengths=`` (prefill and decode are one path). :meth:`Transformer.generate` runs it
token by token (:mod:`attnlab.transformer.generate`).

Every intermediate tensor passes a named hook point (TransformerLens's names, attnlab's shapes:
:mod:`attnlab.transformer.hooks`, tabled in docs/design.md): :meth:`Transformer.run_with_cache`
hands them back, :meth:`Transformer.run_with_hooks` lets functions read or replace them. A hook
point nobody watches costs one set lookup, so the plain forward is the hooked one with no hooks.

torch is imported at module level: this file loads only when ``attnlab.transformer.Transformer``
is first used (the package resolves the name lazily), so ``import attnlab`` needs NumPy only.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.backends.reads import Reads
from attnlab.transformer.attend import Pass, attend, attend_eager, received
from attnlab.transformer.cache import KVCache
from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.ffn import FeedForward
from attnlab.transformer.hooks import WEIGHT_HOOKS, Hooks, build, hook_names
from attnlab.transformer.latent import LatentAttention
from attnlab.transformer.linear import Linear, linear
from attnlab.transformer.norms import head_norm, norm, normed
from attnlab.transformer.rotary import angles, frequencies, rotate
from attnlab.transformer.routed import mixture

# The backends whose math the model's own scores path is: the one a layer takes when its scores or
# pattern are hooked ("auto" then means "torch" for that layer).
EAGER_BACKENDS = ("torch", "auto")


def mean_pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``h`` (B, T, d) over each sequence's real tokens (``mask`` (B, T), 1 = real) → (B, d);
    a sequence with none gives zeros (the divisor is clamped to 1), never NaN."""
    m = mask[..., None].to(h.dtype)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1)


class Attention(nn.Module):
    def __init__(self, c: TransformerConfig, layer: int):
        super().__init__()
        self.c, self.layer, self.at = c, layer, f"blocks.{layer}.attn."  # at: the prefix of its hook points
        self.window = c.attention_window(layer)  # its sliding window as attnlab.masks says it, or None
        self.q = Linear(c.d_model, c.num_heads * c.head_dim, bias=c.bias)
        self.k = Linear(c.d_model, c.heads_kv * c.head_dim, bias=c.bias)
        self.v = Linear(c.d_model, c.heads_kv * c.head_dim, bias=c.bias)
        self.o = Linear(c.num_heads * c.head_dim, c.d_model, bias=c.bias if c.out_bias is None else c.out_bias)
        # QK-norm (Qwen3, Gemma-3): one RMSNorm over Dh for every query head, one for every key head
        self.q_norm = head_norm(c) if c.qk_norm else None
        self.k_norm = head_norm(c) if c.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(c.num_heads)) if c.attn_sinks else None  # gpt-oss: a logit per head
        self.local_rope = c.local_rope(layer)  # Gemma-3's sliding layers turn by their own base

    def forward(self, x: torch.Tensor, p: Pass) -> torch.Tensor:
        c, h, at, (B, T, _) = self.c, p.hooks, self.at, x.shape
        # 1. project and split heads: (B, T, d) → (B, H, T, Dh); k and v may have fewer heads (GQA)
        q = h(at + "hook_q", self.q(x).view(B, T, c.num_heads, c.head_dim).transpose(1, 2))  # (B, H, T, Dh)
        k = h(at + "hook_k", self.k(x).view(B, T, c.heads_kv, c.head_dim).transpose(1, 2))  # (B, Hkv, T, Dh)
        v = h(at + "hook_v", self.v(x).view(B, T, c.heads_kv, c.head_dim).transpose(1, 2))  # (B, Hkv, T, Dh)
        # 2. QK-norm: each head's q and k normed over Dh (scale (B, H, T, 1)), before rotary
        if self.q_norm is not None:
            q, k = normed(self.q_norm, q, h, at + "q_norm"), normed(self.k_norm, k, h, at + "k_norm")
        # 3. rotary positions turn q and k by each token's position (relative positions in q·k)
        if c.positions == "rotary":
            rope = p.rope_local if self.local_rope else p.rope
            q = h(at + "hook_rot_q", rotate(q, rope))
            k = h(at + "hook_rot_k", rotate(k, rope))
        # 4. decoding: append k and v to the cache; the keys read are the cache's [B, Hkv, Tk, Dh] (and what it sees)
        read = None if p.kv is None else p.kv.update(self.layer, p.step, k, v, q.dtype)
        kw = p.visibility(self.window) if read is None else read.kwargs()
        k, v = (k, v) if read is None else (read.k, read.v)
        if self.sinks is not None:  # the learned sinks join every row's softmax, cached or not
            kw["sink_logits"] = self.sinks
        # 5. attend: softmax(softcap(scale · q kᵀ)) v → each head's output z (B, H, T, Dh); by attnlab's
        #    backend, or, when a hook watches the scores or the pattern, the torch backend's steps with the hooks
        last = h.wants(at + "hook_last_pattern")
        eager = h.wants(at + "hook_attn_scores") or h.wants(at + "hook_pattern")
        if eager:
            z, row = attend_eager(q, k, v, p, at, kw, last)
        else:
            z, row = attend(q, k, v, p, kw, last, slot=self.layer)
        if read is not None and read.observe is not None:  # an evicting cache ranks (and cuts) by this attention
            shared = None if eager else row  # attend's own row (the eager one went through the pattern's hooks)
            read.observe(lambda rows: received(q, k, v, p, kw, rows, row=shared))
        if last:  # the newest query's weights, in key-position order (a ring's slots are not)
            h(at + "hook_last_pattern", row if read is None else read.by_position(row, p.step.longest))
        z = h(at + "hook_z", z)
        # 6. merge heads and project out: (B, H, T, Dh) → (B, T, H·Dh) → (B, T, d)
        return self.o(z.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim))


class Block(nn.Module):
    def __init__(self, c: TransformerConfig, layer: int):
        super().__init__()
        self.post, self.at = c.post_norm, f"blocks.{layer}."
        self.attn, self.norm1 = (LatentAttention if c.latent else Attention)(c, layer), norm(c)
        self.ffn = mixture(c, layer) if c.ffn == "experts" else FeedForward(c) if c.ffn != "none" else None
        self.norm2 = norm(c) if self.ffn is not None else None
        # Gemma-2's sandwich: each sublayer's output normed again before its residual sum
        self.norm1_post = norm(c) if c.sandwich_norm else None
        self.norm2_post = norm(c) if c.sandwich_norm and self.ffn is not None else None

    def forward(self, x: torch.Tensor, p: Pass) -> torch.Tensor:
        h, at = p.hooks, self.at
        x = h(at + "hook_resid_pre", x)  # (B, T, d)
        if self.post:  # BERT: x = norm(x + sublayer(x)); the sums are hooked before their norm
            a = h(at + "hook_attn_out", self.attn(x, p))
            if self.ffn is None:
                x = normed(self.norm1, h(at + "hook_resid_post", x + a), h, at + "ln1")
                return h(at + "hook_normalized_resid_post", x)
            x = normed(self.norm1, h(at + "hook_resid_mid", x + a), h, at + "ln1")
            m = h(at + "hook_mlp_out", self.ffn(x, h))
            x = normed(self.norm2, h(at + "hook_resid_post", x + m), h, at + "ln2")
            return h(at + "hook_normalized_resid_post", x)
        # GPT-2, Llama: x = x + sublayer(norm(x)); Gemma-2: x = x + norm_post(sublayer(norm(x)))
        a = self.attn(normed(self.norm1, x, h, at + "ln1"), p)
        if self.norm1_post is not None:
            a = normed(self.norm1_post, a, h, at + "ln1_post")
        a = h(at + "hook_attn_out", a)
        if self.ffn is None:
            return h(at + "hook_resid_post", x + a)
        x = h(at + "hook_resid_mid", x + a)
        m = self.ffn(normed(self.norm2, x, h, at + "ln2"), h)
        if self.norm2_post is not None:
            m = normed(self.norm2_post, m, h, at + "ln2_post")
        m = h(at + "hook_mlp_out", m)
        return h(at + "hook_resid_post", x + m)


class Transformer(nn.Module):
    """The whole model: ``m(input_ids, attention_mask)`` → the last hidden state [B, T, d].

    ``backend`` (default "auto") is the attention backend of every layer; a call may override it.
    ``dtype`` (float32 by default; float64, float16, bfloat16) is the weights' and so the
    computation's (attention accumulates in float32 or wider). Built from a config it has random
    weights; :meth:`from_pretrained` loads real ones.
    """

    def __init__(self, config: TransformerConfig, backend: str = "auto", dtype: Any = None):
        from attnlab.transformer.weights import torch_dtype

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
        self.lm_head = None if c.tie_embeddings else Linear(c.d_model, c.vocab_size, bias=False)
        # a plain attribute, not a buffer: .to(dtype) must not round the frequencies
        self.inv_freq = frequencies(c) if c.positions == "rotary" else None  # (Dh/2,) float64
        rotary_local = c.positions == "rotary" and c.rope_local_theta is not None
        self.inv_freq_local = frequencies(c, local=True) if rotary_local else None  # Gemma-3's sliding layers
        self.to(torch_dtype(dtype))

    @classmethod
    def from_pretrained(cls, model: Any = None, backend: str = "auto", revision: str | None = None,
                        dtype: Any = None) -> Transformer:
        """Weights from safetensors: the bundled default (``None``), a folder or a hub id, in ``dtype``."""
        from attnlab.transformer.weights import load_pretrained

        return load_pretrained(cls, model, backend=backend, revision=revision, dtype=dtype)

    def with_backend(self, backend: str | None) -> Transformer:
        """This model attending by ``backend`` (None: its own): a shallow copy sharing every weight (a call's override)."""
        if backend is None or backend == self.backend:
            return self
        other = copy.copy(self)  # the modules and parameters are the same objects
        other.backend = backend
        return other

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_emb.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.tok_emb.weight.device

    def hook_names(self) -> tuple[str, ...]:
        """Every hook point of this model, in the order they fire."""
        return hook_names(self.config)

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, *, backend: str | None = None,
                kv_cache: KVCache | None = None, documents: Any = None) -> torch.Tensor:
        """The last hidden state [B, T, d] (no hooks). With ``kv_cache``: of the new tokens ``input_ids``
        (``attention_mask`` marks the real ones of each row), appended to the cache. With ``documents``
        ((B, T) or (T,) ints, non-decreasing along a row): a packed batch, each token attending within its
        own document only and its position counted from its document's start (rotary and learned)."""
        return self._forward(input_ids, attention_mask, backend, Hooks(), kv_cache, documents=documents)

    def run_with_hooks(self, input_ids: torch.Tensor, attention_mask: Any = None, *, fwd_hooks: Any = (),
                       backend: str | None = None, kv_cache: KVCache | None = None, documents: Any = None) -> torch.Tensor:
        """Logits [B, T, V] (a causal LM) or the last hidden state [B, T, d] (an encoder), with
        ``fwd_hooks`` [(name, fn), …] run at their hook points: ``fn(tensor, name)`` returns None or a
        replacement of the same shape (several at one name run in order, each on the last's result)."""
        hooks = build(self.config, fwd_hooks)
        return self._output(self._forward(input_ids, attention_mask, backend, hooks, kv_cache, documents=documents))

    def run_with_cache(self, input_ids: torch.Tensor, attention_mask: Any = None, *, names: Any = None,
                       fwd_hooks: Any = (), backend: str | None = None, kv_cache: KVCache | None = None,
                       documents: Any = None) -> tuple[torch.Tensor, dict]:
        """(what :meth:`run_with_hooks` returns, {hook name: tensor}): the tensors of ``names`` (a list,
        a predicate on the name, or None: every hook point), detached, after any ``fwd_hooks`` replaced them."""
        hooks = build(self.config, fwd_hooks, names)
        out = self._output(self._forward(input_ids, attention_mask, backend, hooks, kv_cache, documents=documents))
        return out, hooks.kept

    def generate(self, input_ids: Any, max_new_tokens: int, **kw: Any) -> Any:
        """New tokens with a KV cache (greedy or sampled), the logits they came from and, with
        ``maps=True``, each step's attention row: see :func:`attnlab.transformer.generate.generate`."""
        from attnlab.transformer.generate import generate

        return generate(self, input_ids, max_new_tokens, **kw)

    def _output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden) if self.config.causal else hidden

    def _forward(self, input_ids: Any, attention_mask: Any, backend: str | None, hooks: Hooks,
                 kv_cache: KVCache | None = None, documents: Any = None, reads: Reads | None = None) -> torch.Tensor:
        ids = torch.as_tensor(input_ids, device=self.device)
        if ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(ids.shape)}")
        mask = None if attention_mask is None else torch.as_tensor(attention_mask, device=ids.device).bool()
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"attention_mask must have input_ids' shape {tuple(ids.shape)}, got {tuple(mask.shape)}")
        backend = backend or self.backend
        eager = sorted(n for n in hooks.watched if n.endswith(WEIGHT_HOOKS))
        if eager and backend not in EAGER_BACKENDS:
            raise ValueError(f"hook {eager[0]} needs the attention scores materialised, which the model computes "
                             f"with backend 'torch''s math; got backend {backend!r}: pass backend 'torch' or 'auto'")
        if kv_cache is None:
            return self._body(ids, self._plain_pass(ids, mask, backend, hooks, _documents(documents, ids)))
        if documents is not None:
            raise ValueError("documents= packs sequences into one row of a plain forward; with kv_cache= each row is "
                             "one sequence (pass them as a batch)")
        return self._cached(ids, mask, backend, hooks, kv_cache, reads)

    def _plain_pass(self, ids: torch.Tensor, mask: Any, backend: str, hooks: Hooks, documents: Any = None) -> Pass:
        c, (B, T) = self.config, ids.shape
        # 1. which keys are padding: lengths when it is on the right (every backend serves it), else a mask.
        #    Causal and padded on the right: nothing, since a real token's causal band ends before the
        #    padding (lengths would also move each sequence's queries to its own last positions).
        arange = torch.arange(T, device=ids.device)  # (T,)
        lengths = key_mask = None
        if mask is not None and not bool(mask.all()):
            n = mask.sum(-1)  # (B,)
            right = bool((mask == (arange[None] < n[:, None])).all())
            if not right:
                key_mask = mask[:, None, None, :]  # (B, 1, 1, T)
            elif not c.causal:
                lengths = n
        # 2. positions: 0..T-1 (packed documents: from each document's start), or RoBERTa's count of real
        #    tokens after the pad id
        pos = arange if documents is None else _restart(documents)  # (T,) or (B, T)
        if c.position_offset:
            real = ids.ne(c.pad_token_id).long()  # (B, T)
            pos = real.cumsum(-1) * real + c.pad_token_id
        return Pass(c, backend, c.causal, pos, hooks, lengths=lengths, key_mask=key_mask, documents=documents,
                    **self._rope(pos))

    def _cached(self, ids: torch.Tensor, mask: Any, backend: str, hooks: Hooks, kv: KVCache,
                reads: Reads | None = None) -> torch.Tensor:
        """Decoding: the real tokens of each row right-aligned (a stable sort puts padding first), one
        step of the cache, positions each sequence's own; the hidden states go back to the rows' order."""
        c, (B, T) = self.config, ids.shape
        if not c.causal:
            raise ValueError(f"kv_cache needs a causal decoder; this model is a {c.family} encoder")
        if not isinstance(kv, KVCache):
            raise TypeError(f"kv_cache must be a KVCache (KVCache.for_model), got {type(kv).__name__}")
        kv.check_fits(c, B, device=ids.device)
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask
        order = torch.argsort(real.long(), dim=-1, stable=True)  # (B, T): padding, then real tokens in order
        ids = ids.gather(1, order)
        step = kv.begin(real.sum(-1), T)
        if c.positions == "learned" and int(step.end.max()) > c.max_positions:
            raise ValueError(f"input_ids: the cache holds {int(kv.lengths.max())} tokens; {T} more pass the model's "
                             f"{c.max_positions} learned positions")
        pos = step.positions.clamp(min=0)  # (B, T)
        p = Pass(c, backend, True, pos, hooks, kv=kv, step=step, reads=reads, **self._rope(pos))
        x = self._body(ids, p)
        kv.commit(step)
        return x.scatter(1, order[..., None].expand_as(x), x)  # (B, T, d) in the rows' own order

    def _rope(self, pos: torch.Tensor) -> dict:
        """Pass's ``rope`` and ``rope_local``: the angles of ``pos`` for the global and the local layers."""
        factor = self.config.rope_attention_factor
        return {"rope": None if self.inv_freq is None else angles(pos, self.inv_freq, self.dtype, factor),
                "rope_local": None if self.inv_freq_local is None else angles(pos, self.inv_freq_local, self.dtype)}

    def _body(self, ids: torch.Tensor, p: Pass) -> torch.Tensor:
        h, (B, T) = p.hooks, ids.shape
        # 3. embed: token (× √d in Gemma) (+ learned position + segment 0) → (B, T, d), normed in BERT
        x = self.tok_emb(ids)
        if self.config.embed_scale:
            x = x * torch.tensor(self.config.d_model ** 0.5, dtype=x.dtype)
        x = h("hook_embed", x)  # (B, T, d)
        if self.pos_emb is not None:
            x = x + h("hook_pos_embed", self.pos_emb(p.positions).expand(B, T, -1))  # (T or B, T, d) → (B, T, d)
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
        """Next-token scores [B, T, V] from the last hidden state (the tied embeddings or the LM head),
        softcapped c·tanh(x / c) where the model does (Gemma-2)."""
        c = self.config
        if not c.causal:
            raise ValueError(f"logits need a causal language model, got a {c.family} encoder")
        out = linear(hidden, self.tok_emb.weight) if self.lm_head is None else self.lm_head(hidden)
        return out if c.final_softcap is None else c.final_softcap * torch.tanh(out / c.final_softcap)

    def _decode_step(self, ids: torch.Tensor, real: Any, kv: KVCache, *, backend: str | None, hooks: Hooks,
                     reads: Reads | None = None) -> torch.Tensor:
        """One step of :func:`~attnlab.transformer.generate.generate`: the logits of each row's last column (B, V)
        (its maps are the hooks' ``hook_last_pattern``), the cache read by the generation's ``reads``."""
        return self.logits(self._forward(ids, real, backend, hooks, kv, reads=reads)[:, -1])

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


def _documents(documents: Any, ids: torch.Tensor) -> torch.Tensor | None:
    """``documents`` checked against ``ids`` [B, T]: (T,) or (B, T) ints, non-decreasing along each row."""
    if documents is None:
        return None
    d = torch.as_tensor(documents, device=ids.device)
    if d.dtype.is_floating_point or d.dtype == torch.bool or d.dim() not in (1, 2) or d.shape[-1] != ids.shape[1] or (
            d.dim() == 2 and d.shape[0] != ids.shape[0]):
        raise ValueError(f"documents must be ints shaped (T,) or (B, T) = {tuple(ids.shape)}, one document id per "
                         f"token, got {d.dtype} of shape {tuple(d.shape)}")
    if bool((d[..., 1:] < d[..., :-1]).any()):
        raise ValueError("documents must be non-decreasing along each row (packed documents lie side by side)")
    return d.long()


def _restart(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position inside its document: (T,) or (B, T) → the same shape."""
    t = torch.arange(documents.shape[-1], device=documents.device).expand_as(documents)
    start = torch.ones_like(documents, dtype=torch.bool)
    start[..., 1:] = documents[..., 1:] != documents[..., :-1]
    first = torch.where(start, t, torch.zeros_like(t)).cummax(-1).values  # each token's document start
    return t - first

