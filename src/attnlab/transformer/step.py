"""A decoding step without Python overhead: what :func:`~attnlab.transformer.generate.generate` runs for each new
token when nothing watches the step, with the model's own weights, modules and cache classes.

A step of a small model (the bundled decoder: 4 layers, d = 128) is almost all fixed cost: module calls,
hook look-ups, the per-call checks of every linear layer and attention call, a Pass and rotary angles built
per step. :class:`LeanStep` is built once per generation from the model's own weights and modules and runs
the same arithmetic in the same order with that cost taken out:

- the query, key and value weights of a layer in one matrix, and the gate and up weights of its SwiGLU in
  another, gathered once per generation; every product through the compiled ``_matvec`` (the one
  :func:`attnlab.transformer.linear.linear` calls for a few float32 rows) into buffers allocated once. Each
  output row is one dot product, computed alike in a fused matrix and alone, so the numbers are the same bits;
- the norms as their modules compute them (``F.rms_norm`` and ``F.layer_norm`` are what ``nn.RMSNorm`` and
  ``nn.LayerNorm`` call), without the module call;
- rotary cos and sin looked up in a table of every position the generation reaches, built once by
  :func:`~attnlab.transformer.rotary.angles` (elementwise, so a row of it is what a step computes), q and k
  turned in one call of :func:`~attnlab.transformer.rotary.rotate`;
- the new keys and values checked finite as :meth:`KVCache.update` checks them (the largest key length kept)
  and written by the layer cache's own ``update`` (a narrower or quantized cache: by ``KVCache.update`` itself);
- the layer's attention as :func:`~attnlab.transformer.attend.attend` computes it, by the generation's
  :class:`~attnlab.backends.reads.Reads` (auto's choice kept per layer and length bucket; the kernel's decode
  pass or SDPA called directly for a plain read), as the model's forward reads it in ``generate``.

It serves float32 models on the CPU whose step reads under ``threads.SMALL_STEP_BYTES`` (where fixed costs
rule; larger steps are memory reads and keep the general path), pre-norm decoders with dense or gated
feed-forward networks and one rotary base or learned positions (GPT-2, Llama, Mistral, Qwen2, Qwen3), at
most ``_matvec.MAX_ROWS`` sequences, dense, window, sink, quantized and evicting caches (an evicting cache's
ranking gets the step's attention weights as the forward gives them: :func:`received`), and steps where every
sequence gets its token; with ``maps=True`` each layer's newest row of weights is kept as the forward's
``hook_last_pattern`` keeps it (the same ``attend`` call). Everything else (hooks, a stopped sequence, other
dtypes or architectures) is the model's own forward: :func:`plan` returns None or
:meth:`LeanStep.serves` says no. tests/transformer/test_step.py proves the two give the same tokens, logits and
maps, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.backends.reads import Reads
from attnlab.transformer import linear as linear_mod
from attnlab.transformer.attend import Pass, attend, received
from attnlab.transformer.cache import _finite_norm
from attnlab.transformer.hooks import LAST_PATTERN, Hooks
from attnlab.transformer.layer_cache import Step
from attnlab.transformer.rotary import angles, rotate
from attnlab.transformer.threads import SMALL_STEP_BYTES, step_bytes


def _norm(module: nn.Module) -> Any:
    """The function a norm module's forward is: F.rms_norm / F.layer_norm with its own weights (else the module)."""
    if type(module) is nn.RMSNorm and module.weight is not None:
        shape, w, eps = module.normalized_shape, module.weight, module.eps
        return lambda x: F.rms_norm(x, shape, w, eps)
    if type(module) is nn.LayerNorm and module.weight is not None:
        shape, w, b, eps = module.normalized_shape, module.weight, module.bias, module.eps
        return lambda x: F.layer_norm(x, shape, w, b, eps)
    return module


class _Product:
    """x (B, in) · Wᵀ + b → a buffer (B, out) allocated once, by ``_matvec`` (one or more weights stacked)."""

    def __init__(self, layers: list[nn.Linear], batch: int):
        w = torch.cat([lin.weight.detach() for lin in layers]).contiguous()  # (out, in)
        biases = [lin.bias for lin in layers]
        b = None if biases[0] is None else torch.cat([x.detach() for x in biases]).contiguous()
        self.w, self.b = w, b  # kept alive: the NumPy views below read them
        self.w_np, self.b_np = w.numpy(), None if b is None else b.numpy()
        self.rows, (self.out_features, self.in_features) = batch, w.shape
        self.out = torch.empty(batch, self.out_features)
        self.out_np = self.out.numpy()
        self.into = torch.empty(batch, self.in_features)  # an input buffer, for a caller that writes its x there
        self.into_np = self.into.numpy()

    def __call__(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """The product of ``x``, or of :attr:`into` as the caller left it."""
        x_np = self.into_np if x is None else x.contiguous().numpy()
        linear_mod._matvec.linear(self.w_np, x_np, self.b_np, self.out_np, self.rows, self.out_features,
                                  self.in_features)
        return self.out


class _Layer:
    """One block's step: its weights stacked (:class:`_Product`), its norms' functions and the views of the
    products' buffers, all made once."""

    def __init__(self, index: int, block: nn.Module, c: Any, batch: int, cache: Any):
        a, f, B, H, Hkv, Dh = block.attn, block.ffn, batch, c.num_heads, c.heads_kv, c.head_dim
        self.index, self.cache, self.H = index, cache, H
        self.norm1, self.norm2 = _norm(block.norm1), _norm(block.norm2)
        self.qkv, self.out = _Product([a.q, a.k, a.v], B), _Product([a.o], B)
        y = self.qkv.out  # (B, (H + 2 Hkv) Dh): the query heads, the key heads, then the value heads
        self.qk, self.v = y[:, : (H + Hkv) * Dh].view(B, H + Hkv, 1, Dh), y[:, (H + Hkv) * Dh:].view(B, Hkv, 1, Dh)
        self.qk_norm = None if a.q_norm is None else (a.q_norm, a.k_norm)
        self.sinks, self.act = a.sinks, f.act
        self.up = _Product([f.gate, f.up], B) if f.gate is not None else _Product([f.up], B)
        self.down = _Product([f.down], B)
        g, width = self.up.out, self.down.in_features
        self.gate_up = (g[:, :width], g[:, width:]) if f.gate is not None else None  # act(gate x) ⊙ up x

    def __call__(self, x: torch.Tensor, step: Step, rope: Any, attend_read: Any) -> torch.Tensor:
        """x (B, d) → x (B, d) after the block, its keys and values written."""
        self.qkv(self.norm1(x))
        qk, H = self.qk, self.H
        if self.qk_norm is not None:
            qk = torch.cat((self.qk_norm[0](qk[:, :H]), self.qk_norm[1](qk[:, H:])), dim=1)
        if rope is not None:  # elementwise: q and k turned in one pass are turned as each alone
            qk = rotate(qk, rope)
        q, k = qk[:, :H], qk[:, H:]
        z = attend_read(self, q, self._write(step, k, q.dtype))  # (B, H, 1, Dh)
        x = x + self.out(z.reshape(z.shape[0], -1))
        g = self.up(self.norm2(x))
        if self.gate_up is None:
            return x + self.down(self.act(g))
        # the gate's half made contiguous first: the forward's activation runs over one contiguous (B, d_ff) tensor,
        # and torch's vectorized loop over a strided one ends each row with a scalar tail whose exp may round
        # otherwise (AVX-512: 16 lanes; a row of 24 is 16 + 8), so the same bits need the same layout
        torch.mul(self.act(self.gate_up[0].contiguous()), self.gate_up[1], out=self.down.into)
        return x + self.down()

    def _write(self, step: Step, k: torch.Tensor, dtype: torch.dtype) -> Any:
        """The new keys and values into the cache, checked as :meth:`KVCache.update` checks them; what the step reads."""
        lc, v = self.cache.layers[self.index], self.v
        if lc.k.dtype != dtype:  # a narrower or quantized cache: its update casts (or quantizes) and checks
            return self.cache.update(self.index, step, k, v, dtype)
        lc.k_norm = max(lc.k_norm, _finite_norm(k, v, self.index))  # the model's own tensors: their shapes hold
        return lc.update(step, k, v, dtype)


def _fits(model: Any, kv: Any, hooks: Hooks, maps: bool) -> bool:
    c = model.config
    plain = (c.causal and not c.post_norm and not c.sandwich_norm and c.latent is None and c.ffn in ("mlp", "gated")
             and not c.embed_norm and not c.type_vocab_size and not c.position_offset and c.positions != "none"
             and c.rope_local_theta is None)
    kept = {f"blocks.{layer}.{LAST_PATTERN}" for layer in range(c.num_layers)} if maps else set()
    return (plain and not hooks.fwd and hooks.keep <= kept and linear_mod._matvec is not None
            and model.dtype == torch.float32 and model.device.type == "cpu" and 0 < kv.batch <= linear_mod.MAX_ROWS
            and step_bytes(model, kv) < SMALL_STEP_BYTES)


def plan(model: Any, kv: Any, hooks: Hooks, maps: bool, reads: Reads, positions: int) -> LeanStep | None:
    """The lean step of a generation that reaches ``positions`` positions and reads its cache by ``reads``,
    or None where the model's forward serves every step (see the module's docstring)."""
    return LeanStep(model, kv, reads, positions, hooks if maps else None) if _fits(model, kv, hooks, maps) else None


class LeanStep:
    """One decoding step of ``model`` with ``kv``: ids (B, 1) → the logits (B, V), the cache written."""

    def __init__(self, model: Any, kv: Any, reads: Reads, positions: int, maps: Hooks | None = None):
        c, B = model.config, kv.batch
        self.model, self.kv, self.c, self.maps = model, kv, c, maps  # maps: the generation's hooks, keeping the rows
        self.pass_ = Pass(c, reads.backend, True, None, Hooks(), kv=kv, reads=reads)
        self.ones = torch.ones(B, dtype=torch.long, device=kv.lengths.device)
        self.layers = [_Layer(i, block, c, B, kv) for i, block in enumerate(model.blocks)]
        self.known: dict = {}  # what each step's Step would compute from the lengths: even, and the longest
        self.final = _norm(model.final_norm)
        head = model.tok_emb.weight if model.lm_head is None else model.lm_head.weight
        self.head = head.detach()
        self.head_np = self.head.numpy()
        self.cos = self.sin = None
        if c.positions == "rotary":  # (positions, Dh) each: a row per position, as angles() gives it per step
            self.cos, self.sin = angles(torch.arange(positions, device=kv.lengths.device), model.inv_freq, model.dtype,
                                        c.rope_attention_factor)

    def serves(self, ids: torch.Tensor, real: Any) -> bool:
        """One new token for every sequence, none stopped (the rotary table holds every position the call reaches)."""
        return real is None and ids.shape == (self.kv.batch, 1)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        c, kv, m = self.c, self.kv, self.model
        step = self._step()
        x = m.tok_emb.weight[ids[:, 0]]  # (B, d)
        if c.embed_scale:
            x = x * torch.tensor(c.d_model ** 0.5, dtype=x.dtype)
        # every sequence at one position (an even step): that row, broadcast; else each sequence's (B, 1, 1, ·)
        at = self.known["longest"] - 1 if self.known["even"] else step.start[:, None, None]
        rope = None
        if self.cos is not None:
            rope = (self.cos[at], self.sin[at])  # (Dh,) or (B, 1, 1, Dh) each
        else:
            x = x + m.pos_emb.weight[at].view(-1, c.d_model)  # (1 or B, d)
        for layer in self.layers:
            x = layer(x, step, rope, self._attend)
        kv.commit(step)
        x = self.final(x)
        logits = torch.empty(kv.batch, self.head.shape[0])
        linear_mod._matvec.linear(self.head_np, x.contiguous().numpy(), None, logits.numpy(), kv.batch, *self.head.shape)
        return logits if c.final_softcap is None else c.final_softcap * torch.tanh(logits / c.final_softcap)

    def _step(self) -> Step:
        """What ``kv.begin`` says of one new token per sequence; whether the sequences start alike (they stay so
        while each gets one token a step) and the longest, known without reading the lengths again."""
        kv, known = self.kv, self.known
        step = Step(kv.lengths.clone(), self.ones, 1, True)
        if not known:
            known.update(even=step.even, longest=step.longest)
        else:
            known["longest"] += 1
            vars(step).update(known)  # Step's cached properties, set as they would compute
        return step

    def _attend(self, layer: _Layer, q: torch.Tensor, read: Any) -> torch.Tensor:
        """The layer's attention over the cache's read, z (B, H, 1, Dh): as :func:`attend` computes it, a
        plain read through the generation's :class:`~attnlab.backends.reads.Reads` (auto's choice kept per
        layer and length bucket, the kernel's decode pass or SDPA called directly)."""
        kw = read.kwargs()
        if layer.sinks is not None:
            kw["sink_logits"] = layer.sinks
        if self.maps is None:
            z, row = attend(q, read.k, read.v, self.pass_, kw, slot=layer.index)[0], None
        else:
            z, row = attend(q, read.k, read.v, self.pass_, kw, last=True, slot=layer.index)  # the forward's call for maps
            self.maps(f"blocks.{layer.index}.{LAST_PATTERN}", read.by_position(row, self.known["longest"]))
        if read.observe is not None:  # an evicting cache ranks by this step's attention, as the forward has it do
            read.observe(lambda rows: received(q, read.k, read.v, self.pass_, kw, rows, row=row))
        return z
