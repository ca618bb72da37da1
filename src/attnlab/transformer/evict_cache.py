"""Evicting KV caches: a layer keeps at most ``budget`` tokens per k/v head, each head its own positions.

A policy ranks the keys a layer holds; the lowest-ranked leaves when room is needed. Every policy keeps
the first ``sinks`` positions (StreamingLLM's attention sinks, default 4) and the newest ``recent``
positions; the budget counts them. The policies:

- **h2o** (Zhang et al. 2023, Heavy-Hitter Oracle): a key's rank is the attention it has received so far,
  summed over the query heads of its k/v head and over every query that saw it (the prompt's and each
  decoding step's); ``recent`` defaults to half the budget (H2O's equal split of heavy and recent).
- **snapkv** (Li et al. 2024): a prompt key's rank is the attention the prompt's last W queries give it,
  summed over the group's query heads, then averaged over a window of :data:`SNAPKV_KERNEL` neighbouring
  keys (SnapKV's pooling, as kvpress's SnapKVPress); the last W positions are kept (W = ``recent``,
  default ``min(32, budget // 2)``). SnapKV compresses the prompt: a generated token outranks every
  prompt key, and among generated tokens the oldest leaves first.
- **knorm** (Devoto et al. 2024): keys of smallest L2 norm are kept (rotary turns preserve it).
- **random**: a rank drawn once per key from a seeded generator: the baseline an eviction policy must beat.

When eviction happens: a step of one token makes room first (the lowest-ranked key leaves, the new one
takes its slot), so the step attends to exactly what is kept, itself included. A step of several tokens
(the prompt) attends to everything held plus all of its tokens (the prompt's queries see the whole
prompt), then is cut to the budget before the next step. Keys keep the rotary angle of their original
position (as the window and sink caches do), so a step equals the reference attention over the kept
positions at their own positions. In a slot a key's index says nothing of its position: these layers read
no position-dependent mask, and a model's sliding-window layers keep their own window ring instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from attnlab.transformer.layer_cache import SINK_DEFAULT, LayerCache, Read, Step, _read

POLICIES = ("h2o", "snapkv", "knorm", "random")
SNAPKV_WINDOW = 32  # SnapKV's observation window W (its paper's default) when budget // 2 allows it
SNAPKV_KERNEL = 5  # the width of SnapKV's average pooling over neighbouring keys (kvpress's default)
GENERATED = 1.0e12  # snapkv: a generated token's rank, plus its position (the oldest leaves first)


def recent_default(policy: str, budget: int, sinks: int) -> int:
    """The newest positions a policy keeps when ``window=`` is not given (at least the newest token)."""
    share = budget // 2 if policy == "h2o" else min(SNAPKV_WINDOW, budget // 2) if policy == "snapkv" else 1
    return max(1, min(share, budget - sinks))


def evict_kinds(config: Any, kind: str, window: int | None, sink: int | None, budget: Any) -> list[tuple]:
    """Each layer's (kind, recent, sinks) for an evicting cache of ``kind`` with ``budget`` tokens; a
    sliding-window layer keeps its own window ring (("window", W, None)). Checked before any work."""
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise ValueError(f"cache_budget: cache={kind!r} needs cache_budget= (tokens kept per layer and k/v head, "
                         f"sinks included), an int, got {budget!r}")
    for name, value, least in (("window", window, 1), ("sink", sink, 0)):  # an evicting cache may keep no sinks
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name} must be an int >= {least} or None for cache={kind!r}, got {value!r}")
    sinks = SINK_DEFAULT if sink is None else sink
    if budget < sinks + 1:
        raise ValueError(f"cache_budget={budget} is below the {sinks} sink tokens plus the newest token; it must be "
                         f">= {sinks + 1} (sink= sets the sinks)")
    if budget > config.max_positions:
        raise ValueError(f"cache_budget={budget} is above the model's context of {config.max_positions} positions; "
                         "a dense cache keeps every position there")
    recent = recent_default(kind, budget, sinks) if window is None else window
    if sinks + recent > budget:
        raise ValueError(f"window={recent} newest positions + {sinks} sinks pass cache_budget={budget}")
    own = [config.layer_window(layer) for layer in range(config.num_layers)]
    return [(kind, recent, sinks) if w is None else ("window", w, None) for w in own]


def check_budget(layers: list, budget: int | None) -> None:
    """A cache passed back in keeps the budget asked for (its evicting layers' own)."""
    held = sorted({lc.budget for lc in layers if isinstance(lc, EvictingCache)})
    if held and held != [budget]:
        raise ValueError(f"kv_cache keeps {held[0]} tokens per layer and k/v head; cache_budget={budget!r} asks for "
                         "another budget (pass the one it was built with)")


class EvictingCache(LayerCache):
    """``budget`` slots per k/v head; ``slot_positions`` (B, H_kv, budget) is each head's own (−1: empty),
    the held keys fill slots 0..held − 1 of every head, in no particular order; ``rank`` (B, H_kv, budget)
    is the policy's score of each held key (the lowest leaves). ``full``: every sequence holds ``budget`` keys,
    so a decoding step only replaces one per head (set where the slots are written, not counted each step)."""

    def __init__(self, batch: int, heads: int, dim: int, budget: int, sinks: int, recent: int, policy: str,
                 dtype: torch.dtype, device: Any, seed: int = 0):
        super().__init__(batch, heads, dim, budget, dtype, device)
        self.kind, self.sink, self.window, self.budget = policy, sinks, recent, budget
        self.slot_positions = torch.full((batch, heads, budget), -1, dtype=torch.long, device=device)  # (B, H_kv, C)
        self.rank = torch.zeros(batch, heads, budget, dtype=torch.float64, device=device)  # (B, H_kv, C)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.full = False  # every sequence holds ``budget`` keys (set where the slots are written)

    def visibility(self) -> None:
        return None  # a slot's index is no position: every held key is visible to the step's queries

    def describe(self) -> dict:
        return {"kind": self.kind, "capacity": self.capacity, "budget": self.budget, "sink": self.sink,
                "recent": self.window}

    @property
    def held(self) -> torch.Tensor:
        """(B,) keys held per sequence (every head holds as many)."""
        return (self.slot_positions[:, 0] >= 0).sum(-1)

    def _entry_rank(self, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The rank new keys k (B, H_kv, N, D) at positions ``pos`` (B, N) enter with: (B, H_kv, N)."""
        shape = k.shape[:3]
        if self.kind == "knorm":
            return -k.double().norm(dim=-1)
        if self.kind == "random":
            return torch.rand(shape, generator=self.generator, dtype=torch.float64, device=k.device)
        if self.kind == "snapkv":
            return GENERATED + pos[:, None, :].double().expand(shape)
        return torch.zeros(shape, dtype=torch.float64, device=k.device)  # h2o: the attention it will receive

    def _spare(self, pos: torch.Tensor, newest: torch.Tensor) -> torch.Tensor:
        """Held keys at ``pos`` (B, H_kv, N) that may leave by their rank: neither sinks nor among the ``recent``
        newest positions up to ``newest`` (B,); the others (empty slots, −1, aside) stay whatever their rank."""
        return (pos >= self.sink) & (pos <= newest[:, None, None] - self.window)

    def update(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        if step.tq == 1:
            return self._decode(step, k, v, dtype)
        return self._chunk(step, k, v, dtype)

    def _decode(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        """One token: the lowest-ranked unprotected key leaves where the layer is full, the new one takes
        its slot (else the next free slot); the step then reads every held key, itself included."""
        B, H = k.shape[:2]
        pos = step.start  # (B,)
        if step.decode and self.full:  # decoding in the steady state: every sequence writes over its victims
            writes, slot = None, self._victims(pos)  # (B, H_kv)
        else:
            held, writes = self.held, step.new.bool()  # (B,) each
            slot = held[:, None].expand(B, H).clone()  # (B, H_kv)
            full = writes & (held >= self.budget)
            if bool(full.any()):
                slot = torch.where(full[:, None], self._victims(pos), slot)
        if step.decode:  # every sequence writes: one scatter along the slots per tensor, no search
            at = slot[:, :, None]  # (B, H_kv, 1)
            self.k.scatter_(2, at[..., None].expand(B, H, 1, k.shape[-1]), k.to(self.k.dtype))
            self.v.scatter_(2, at[..., None].expand(B, H, 1, v.shape[-1]), v.to(self.v.dtype))
            self.slot_positions.scatter_(2, at, pos[:, None, None].expand(B, H, 1))
            self.rank.scatter_(2, at, self._entry_rank(k, pos[:, None]))
        else:  # a stopped sequence's column writes nothing
            b, h = writes[:, None].expand(B, H).nonzero(as_tuple=True)  # (N,), (N,)
            s = slot[b, h]
            self.k[b, h, s], self.v[b, h, s] = k[b, h, 0], v[b, h, 0]  # (N, D)
            self.slot_positions[b, h, s] = pos[b]
            self.rank[b, h, s] = self._entry_rank(k, pos[:, None])[b, h, 0]
        tk, lengths = self.budget, None  # full: every slot held
        if not self.full:
            after = self.held  # (B,)
            tk = max(int(after.max()), 1)
            lengths = None if bool((after == tk).all()) else after
            self.full = lengths is None and tk == self.budget
        observe = partial(self._observe_decode, writes, tk) if self.kind == "h2o" else None
        read = _read(self, self.k[:, :, :tk], self.v[:, :, :tk], lengths, None, self.slot_positions[:, :, :tk], dtype)
        return _with_observe(read, observe)

    def _victims(self, pos: torch.Tensor) -> torch.Tensor:
        """(B, H_kv) each head's lowest-ranked spare key, for the token at ``pos`` (B,)."""
        return torch.where(self._spare(self.slot_positions, pos), self.rank, torch.inf).argmin(-1)

    def _observe_decode(self, writes: torch.Tensor | None, tk: int, received: Callable[[range], torch.Tensor]) -> None:
        """h2o: the step's query adds its weights to each held key's rank (a stopped sequence's column adds none)."""
        got = _per_kv_head(received(range(1)), self.k.shape[1])  # (B, H_kv, Tk)
        self.rank[:, :, :tk] += got if writes is None else got * writes[:, None, None]  # None: every sequence wrote

    def _chunk(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        """Several tokens: the read is every held key (slots 0..held − 1) then the new ones, per sequence;
        the step's queries see all of them (causal among the new); the cut comes after (:meth:`_cut`)."""
        B, H, C, tq = k.shape[0], k.shape[1], self.capacity, step.tq
        held = self.held  # (B,)
        tk = max(int((held + step.new).max()), 1)
        j = torch.arange(tk, device=k.device)[None]  # (1, Tk)
        old, new = j < held[:, None], (j >= held[:, None]) & (j < (held + step.new)[:, None])  # (B, Tk) each
        new_col = C + tq - step.new[:, None] + (j - held[:, None])  # (B, Tk): index into cat(held, new)
        index = torch.where(old, j.expand(B, tk), torch.where(new, new_col, 0))  # (B, Tk)
        idx = index[:, None, :, None].expand(B, H, tk, k.shape[-1])  # (B, H_kv, Tk, D)
        keys = torch.cat((self.k, k), dim=2).gather(2, idx)  # (B, H_kv, C + Tq, D) → (B, H_kv, Tk, D)
        values = torch.cat((self.v, v), dim=2).gather(2, idx)
        new_pos = torch.where(new, step.start[:, None] + j - held[:, None], -1)  # (B, Tk)
        held_j = torch.clamp(j, max=C - 1).expand(B, tk)[:, None].expand(B, H, tk)  # (B, H_kv, Tk)
        pos = torch.where(old[:, None], self.slot_positions.gather(2, held_j), new_pos[:, None])  # (B, H_kv, Tk)
        rank = torch.where(old[:, None], self.rank.gather(2, held_j), self._entry_rank(keys, new_pos))
        rank = torch.where(pos >= 0, rank, 0.0)  # (B, H_kv, Tk)
        read = _read(self, keys, values, held + step.new, None, pos, dtype)
        return _with_observe(read, partial(self._cut, keys, values, pos, rank, step, tq))

    def _cut(self, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor, rank: torch.Tensor, step: Step,
             tq: int, received: Callable[[range], torch.Tensor]) -> None:
        """After a chunk's attention: rank what it read (h2o: every query's weights added; snapkv: the last W
        queries' weights, pooled) and keep the ``budget`` best per k/v head, sinks and recent ones first."""
        H = keys.shape[1]
        if self.kind == "h2o":
            rank = rank + _per_kv_head(received(range(tq)), H)
        elif self.kind == "snapkv":
            got = _per_kv_head(received(range(max(0, tq - self.window), tq)), H)  # (B, H_kv, Tk)
            pooled = torch.nn.functional.avg_pool1d(got.flatten(0, 1)[:, None], SNAPKV_KERNEL, stride=1,
                                                    padding=SNAPKV_KERNEL // 2, count_include_pad=False)
            rank = torch.where(pos >= step.start[:, None, None], pooled[:, 0].view_as(got), rank)  # this chunk's keys
        newest = (step.end - 1)  # (B,)
        order = torch.where(pos < 0, -torch.inf, torch.where(self._spare(pos, newest), rank, torch.inf))
        n = min(self.budget, pos.shape[2])
        keep = order.topk(n, dim=-1).indices  # (B, H_kv, n): protected, then best ranked, then empty
        kept_pos = pos.gather(2, keep)  # (B, H_kv, n)
        filled = (kept_pos >= 0)[..., None]  # (B, H_kv, n, 1)
        idx = keep[..., None].expand(-1, -1, -1, keys.shape[-1])  # (B, H_kv, n, D)
        self.k.zero_(), self.v.zero_(), self.slot_positions.fill_(-1), self.rank.zero_()
        self.k[:, :, :n] = torch.where(filled, keys.gather(2, idx), 0)
        self.v[:, :, :n] = torch.where(filled, values.gather(2, idx), 0)
        self.slot_positions[:, :, :n] = kept_pos
        self.rank[:, :, :n] = torch.where(kept_pos >= 0, rank.gather(2, keep), 0.0)
        self.full = n == self.budget and bool((kept_pos >= 0).all())


def _per_kv_head(w: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """Query heads' weights (B, H, Tk) summed over each k/v head's group → (B, H_kv, Tk), float64."""
    B, H, tk = w.shape
    return w.detach().double().view(B, heads_kv, H // heads_kv, tk).sum(2)  # query head h reads k/v head h // (H / H_kv)


def _with_observe(read: Read, observe: Any) -> Read:
    return read if observe is None else replace(read, observe=observe)
