"""One layer's keys and values in the KV cache (:mod:`attnlab.transformer.cache`), and the read a step
passes to :func:`attnlab.attention`.

A layer keeps one of three kinds:

- **dense**: slot = position. Its capacity grows by doubling (at least to what a write needs) when
  a write would pass it; :meth:`Transformer.generate` allocates exactly prompt + max_new_tokens, so
  there it never grows. A layer with a sliding window reads it through the band.
- **window** W: a ring of the last W positions, slot = position mod W; memory stops growing at W.
  A token sees itself and the W − 1 before it (transformers' ``sliding_window = W``).
- **sink** S + window W (StreamingLLM, Xiao et al. 2023): positions 0..S−1 in slots 0..S−1, later
  positions in a ring of W slots after them; a token sees the S first tokens and the last W,
  itself included.

**Positions are those of the original sequence** in every kind: a key keeps the rotary angle (or
learned position) of the place it stood, and the query at position p is turned by p. A window or
sink cache therefore computes exactly what a full recompute computes with a mask that keeps keys
0..S−1 and p − W + 1..p (tested). StreamingLLM instead re-numbers the cached keys by their slot so
that no distance exceeds S + W; attnlab does not, because that changes every cached key at every
step and is no longer the model's computation: past the trained length the sink distances are
positions the model has not seen (rotary models compute them; learned positions refuse them).
``slot_positions`` (B, capacity) maps each slot back to its position (−1: empty): the attention rows
of :meth:`Transformer.generate` are put back in position order through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from attnlab import masks
from attnlab.backends import pages
from attnlab.reference.validate import CACHE_DTYPES

SINK_DEFAULT = 4  # StreamingLLM's choice: four initial tokens carry the attention sink
DENSE_START = 256  # slots a dense layer starts with when no capacity is given (a model may have 128k positions)


@dataclass(frozen=True)
class Step:
    """One call's new tokens. They are right-aligned in the call's Tq columns: the last ``new[b]``
    columns of sequence b are real, at positions ``start[b]``.. (padding columns come first), which
    is what the per-sequence causal rule (query i at lengths[b] − Tq + i) computes."""

    start: torch.Tensor  # (B,) tokens in the cache before this call
    new: torch.Tensor  # (B,) real new tokens
    tq: int
    decode: bool = False  # one new token in every sequence: written without a search, rings read as they lie

    # Computed once per step, read by every layer.
    @cached_property
    def end(self) -> torch.Tensor:
        return self.start + self.new  # (B,)

    @cached_property
    def longest(self) -> int:
        """The longest sequence once the step is written."""
        return int(self.end.max())

    @cached_property
    def even(self) -> bool:
        """Every sequence starts at one position and gets as many new tokens (one sequence, or equal prompts)."""
        return bool((self.start == self.start[0]).all() and (self.new == self.new[0]).all())

    @cached_property
    def positions(self) -> torch.Tensor:
        """(B, Tq) each column's position; padding columns get the ones before (negative: none)."""
        cols = torch.arange(self.tq, device=self.start.device)
        return (self.end - self.tq)[:, None] + cols[None]

    @cached_property
    def real(self) -> torch.Tensor:
        """(B, Tq) bool: the column holds a new token."""
        cols = torch.arange(self.tq, device=self.start.device)
        return cols[None] >= (self.tq - self.new)[:, None]


@dataclass(frozen=True)
class Read:
    """What one layer's attention reads for one step: keys and values [B, H_kv, Tk, D] (:func:`_as_read`),
    their ``lengths`` (B,), which keys each query sees beyond causal (an attnlab.masks description in the
    read's key order, or None), each key's position (B, Tk) (−1: none) and the bound of the key lengths when
    the keys are read exactly as checked (None: the call checks them)."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor | None  # None: every sequence's Tk (an even step)
    mask: masks.Mask | None  # the window (or a sink's first keys and window) in the read's key order
    key_positions: torch.Tensor  # (B, Tk), or (B, H_kv, Tk) where each k/v head keeps its own (an evicting cache)
    k_norm: float | None = None
    observe: Any = None  # an evicting cache's observe(received): after the step's attention, ranks and cuts its keys

    def kwargs(self) -> dict:
        """The keyword arguments of :func:`attnlab.attention` for this read: causal, each sequence's length
        (its queries are its newest tokens: masks.cache_lengths) and the layer's own visibility."""
        checked = {} if self.k_norm is None else {"kv_checked": True, "k_norm": self.k_norm}
        return {"mask": self.mask, "lengths": self.lengths, "causal": True, **checked}

    def by_position(self, w: torch.Tensor, width: int) -> torch.Tensor:
        """Weights over the read's keys (B, H, Tk) in position order (B, H, width): key j of sequence b at
        ``key_positions[b, j]`` (−1: an empty slot, dropped); positions no key holds get 0."""
        B, H, _ = w.shape
        out = w.new_zeros(B, H, width + 1)  # the last column takes the empty slots, then goes
        pos = self.key_positions
        pos = pos[:, None].expand(B, H, -1) if pos.dim() == 2 else pos.repeat_interleave(H // pos.shape[1], dim=1)
        out.scatter_(2, torch.where(pos >= 0, pos, width).clamp(max=width), w)  # (B, H, Tk) → (B, H, width + 1)
        return out[..., :width]


def _as_read(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cached keys or values as a ``dtype`` query reads them: as stored where attention() takes the mix
    (a 16-bit cache under a float32 query), else converted to ``dtype``."""
    name, want = str(x.dtype).removeprefix("torch."), str(dtype).removeprefix("torch.")
    return x if name == want or name in CACHE_DTYPES.get(want, ()) else x.to(dtype)


def _read(layer: LayerCache, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None, mask: masks.Mask | None,
          positions: torch.Tensor, dtype: torch.dtype) -> Read:
    """A :class:`Read` of the cache's ``k``, ``v`` by a ``dtype`` query; checked where the read is exact
    (as stored, or widened), so that the attention call skips its own scan."""
    rk, rv = _as_read(k, dtype), _as_read(v, dtype)
    exact = rk.dtype == k.dtype or torch.finfo(rk.dtype).bits > torch.finfo(k.dtype).bits
    return Read(rk, rv, lengths, mask, positions, layer.k_norm if exact else None)


class LayerCache:
    """One layer's keys, values and slot positions, and how they are written. Each kind (:class:`DenseCache`,
    :class:`WindowCache`, :class:`SinkCache`) says where a position goes (:meth:`slots`), which positions
    stay once ``last`` is written (:meth:`retains`), which keys a query sees beyond causal, as an
    attnlab.masks description of keys in position order (:meth:`visibility`), and what a step reads (:meth:`update`)."""

    kind = ""

    def __init__(self, batch: int, heads: int, dim: int, capacity: int, dtype: torch.dtype, device: Any,
                 window: int | None = None):
        self.window = window  # W: keys a token sees, itself included (None: all before it)
        self.k = pages.zeros((batch, heads, capacity, dim), dtype, device)  # (B, H_kv, C, D), on huge pages
        self.v = pages.zeros(self.k.shape, dtype, device)
        self.slot_positions = torch.full((batch, capacity), -1, dtype=torch.long, device=device)  # (B, C)
        self.k_norm = 0.0  # the largest ‖k_j‖ ever appended (an upper bound of the keys held)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def slots(self, pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def retains(self, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def visibility(self) -> masks.Mask | None:
        """Which keys a query sees beyond causal, keys in position order: its window (W keys, itself included)."""
        return None if self.window is None else masks.sliding_window(self.window)

    def update(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"kind": self.kind, "capacity": self.capacity, "window": self.window}

    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        size = max(2 * self.capacity, needed)
        B, H, C, D = self.k.shape
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = pages.zeros((B, H, size, D), old.dtype, old.device)  # (B, H_kv, size, D)
            grown[:, :, :C] = old
            setattr(self, name, grown)
        pos = self.slot_positions.new_full((B, size), -1)
        pos[:, :C] = self.slot_positions
        self.slot_positions = pos

    def write(self, step: Step, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put the real new columns at their slots (those the kind retains once the last is written)."""
        if step.decode and step.even:  # one slot for every sequence: a plain copy
            slot = int(self.slots(step.start[:1]))
            self.k[:, :, slot], self.v[:, :, slot] = k[:, :, 0], v[:, :, 0]  # (B, H_kv, D)
            self.slot_positions[:, slot] = step.start
            return
        if step.decode:  # the newest position is always retained
            b, pos = torch.arange(k.shape[0], device=k.device), step.start  # (B,), (B,)
            slot = self.slots(pos)
            self.k[b, :, slot], self.v[b, :, slot] = k[:, :, 0], v[:, :, 0]  # (B, H_kv, D)
            self.slot_positions[b, slot] = pos
            return
        pos = step.positions  # (B, Tq)
        keep = step.real & self.retains(pos, (step.end - 1)[:, None])
        b, col = keep.nonzero(as_tuple=True)  # (N,), (N,)
        slot = self.slots(pos[b, col])
        self.k[b, :, slot] = k[b, :, col]  # (N, H_kv, D)
        self.v[b, :, slot] = v[b, :, col]
        self.slot_positions[b, slot] = pos[b, col]



class DenseCache(LayerCache):
    """Slot = position; its capacity doubles (at least to what a write needs) when a write would pass it.
    A layer with a sliding window reads it through its visibility."""

    kind = "dense"

    def slots(self, pos: torch.Tensor) -> torch.Tensor:
        return pos

    def retains(self, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(pos, dtype=torch.bool)

    def update(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        """Write the new keys and values and say what the step's queries read (dense: the prefix in place)."""
        self._grow(step.longest)
        self.write(step, k, v)
        tk = max(step.longest, 1)
        lengths = None if step.even else step.end  # even: every sequence is the Tk keys read
        return _read(self, self.k[:, :, :tk], self.v[:, :, :tk], lengths, self.visibility(), self.slot_positions[:, :tk],
                     dtype)



class WindowCache(LayerCache):
    """A ring of the last W positions: slot = position mod W."""

    kind = "window"

    def __init__(self, batch: int, heads: int, dim: int, window: int, dtype: torch.dtype, device: Any):
        super().__init__(batch, heads, dim, window, dtype, device, window=window)

    def slots(self, pos: torch.Tensor) -> torch.Tensor:
        return pos % self.window

    def retains(self, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return pos > last - self.window

    def update(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        if step.decode:  # every slot a query may see, and no other, is filled: read the ring as it lies
            self.write(step, k, v)
            tk = min(step.longest, self.capacity)  # filled slots, a prefix of the ring
            n = None if step.even else torch.clamp(step.end, max=self.capacity)  # (B,)
            return _read(self, self.k[:, :, :tk], self.v[:, :, :tk], n, None, self.slot_positions[:, :tk], dtype)
        read = _gathered(self, step, k, v, dtype)  # before the write: a chunk may overwrite what it reads
        self.write(step, k, v)
        return read


class SinkCache(WindowCache):
    """StreamingLLM: positions 0..S−1 in slots 0..S−1, the last W positions after S in a ring of W slots."""

    kind = "sink"

    def __init__(self, batch: int, heads: int, dim: int, sink: int, window: int, dtype: torch.dtype, device: Any):
        LayerCache.__init__(self, batch, heads, dim, sink + window, dtype, device, window=window)
        self.sink = sink

    def slots(self, pos: torch.Tensor) -> torch.Tensor:
        return torch.where(pos < self.sink, pos, self.sink + (pos - self.sink) % self.window)

    def retains(self, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return (pos < self.sink) | (pos > last - self.window)

    def visibility(self) -> masks.Mask:
        """Its first S keys and its window; keys in position order, the first S are the sink's."""
        return masks.sliding_window(self.window) | masks.sink_tokens(self.sink)

    def describe(self) -> dict:
        return super().describe() | {"sink": self.sink}


def _gathered(layer: LayerCache, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
    """A chunk's read of a ring: the stored keys in position order, then the new ones, from slot 0.

    In that order a key's index differs from a query's as their positions do past the first S (the sink's),
    so the layer's visibility (window, or sink tokens and window) says which each query sees, as for a full
    recompute.
    """
    B, C, tq = k.shape[0], layer.capacity, step.tq
    stored = layer.slot_positions  # (B, C), −1 empty
    count = (stored >= 0).sum(-1)  # (B,)
    order = torch.where(stored >= 0, stored, torch.iinfo(torch.long).max).argsort(dim=-1)  # (B, C) slots by position
    tk = max(int((count + step.new).max()), 1)
    j = torch.arange(tk, device=k.device)[None]  # (1, Tk)
    old, new = j < count[:, None], (j >= count[:, None]) & (j < (count + step.new)[:, None])  # (B, Tk) each
    old_slot = order.gather(1, torch.clamp(j, max=C - 1).expand(B, tk))  # (B, Tk)
    new_col = C + tq - step.new[:, None] + (j - count[:, None])  # (B, Tk): index into cat(stored, new)
    index = torch.where(old, old_slot, torch.where(new, new_col, 0))  # (B, Tk)
    kpos = torch.where(old, stored.gather(1, old_slot), torch.where(new, step.start[:, None] + j - count[:, None], -1))
    idx = index[:, None, :, None].expand(B, k.shape[1], tk, k.shape[-1])  # (B, H_kv, Tk, D)
    keys = torch.cat((layer.k, k), dim=2).gather(2, idx)  # (B, H_kv, C + Tq, D) → (B, H_kv, Tk, D)
    values = torch.cat((layer.v, v), dim=2).gather(2, idx)
    return _read(layer, keys, values, count + step.new, layer.visibility(), kpos, dtype)
