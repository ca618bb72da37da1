"""The key/value cache of attnlab's transformer: what decoding keeps of every token before the new ones.

The layout is the one :func:`attnlab.attention` (and the compiled decode kernel) reads: per layer,
contiguous keys and values ``[B, H_kv, capacity, D]``, zero in every slot no token was written to,
and per sequence ``lengths`` (B,), the tokens written so far (the same for every layer). New tokens
are written at each sequence's own offset, so a batch of prompts of unequal length is one cache.
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

Entries are validated once, when appended (shape, dtype, finite, after the cast to the cache's
dtype), and each layer keeps the largest key length ‖k_j‖ it was given; the attention calls that
read them then skip the scan of the whole cache (``kv_checked=True, k_norm=``). A read is one call
``attnlab.attention(q, k, v, lengths=, causal=True, window=)``: causal with lengths is each sequence's
own (query i of sequence b at lengths[b] − Tq + i), which is how a step's new tokens are placed.
A cache may hold a narrower dtype than the weights (``cache_dtype``, e.g. bfloat16 under float32):
a float32 query reads a float16 or bfloat16 cache as stored (attention() takes that mix); any other
is read back in the query's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from attnlab.backends.request import max_norm
from attnlab.reference.validate import CACHE_DTYPES
from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.weights import torch_dtype

KINDS = ("dense", "window", "sink")
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

    @property
    def end(self) -> torch.Tensor:
        return self.start + self.new  # (B,)

    @property
    def positions(self) -> torch.Tensor:
        """(B, Tq) each column's position; padding columns get the ones before (negative: none)."""
        cols = torch.arange(self.tq, device=self.start.device)
        return (self.end - self.tq)[:, None] + cols[None]

    @property
    def real(self) -> torch.Tensor:
        """(B, Tq) bool: the column holds a new token."""
        cols = torch.arange(self.tq, device=self.start.device)
        return cols[None] >= (self.tq - self.new)[:, None]


@dataclass(frozen=True)
class Read:
    """What one layer's attention reads for one step: keys and values [B, H_kv, Tk, D] (:func:`_as_read`),
    their ``lengths`` (B,), the band or an explicit mask, each key's position (B, Tk) (−1: none) and
    the bound of the key lengths when the keys are read exactly as checked (None: the call checks them)."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor
    window: tuple[int, int] | None
    mask: torch.Tensor | None  # (B, 1, Tq, Tk) bool where the lengths and the band cannot say it (a sink's gap)
    key_positions: torch.Tensor
    k_norm: float | None = None

    def kwargs(self) -> dict:
        """The keyword arguments of :func:`attnlab.attention` for this read."""
        checked = {} if self.k_norm is None else {"kv_checked": True, "k_norm": self.k_norm}
        if self.mask is not None:
            return {"mask": self.mask, "lengths": self.lengths, "causal": False, **checked}
        return {"lengths": self.lengths, "causal": True, "window": self.window, **checked}


def _as_read(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cached keys or values as a ``dtype`` query reads them: as stored where attention() takes the mix
    (a 16-bit cache under a float32 query), else converted to ``dtype``."""
    name, want = str(x.dtype).removeprefix("torch."), str(dtype).removeprefix("torch.")
    return x if name == want or name in CACHE_DTYPES.get(want, ()) else x.to(dtype)


def _read(layer: LayerCache, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, window: Any, mask: Any,
          positions: torch.Tensor, dtype: torch.dtype) -> Read:
    """A :class:`Read` of the cache's ``k``, ``v`` by a ``dtype`` query; checked where the read is exact
    (as stored, or widened), so that the attention call skips its own scan."""
    rk, rv = _as_read(k, dtype), _as_read(v, dtype)
    exact = rk.dtype == k.dtype or torch.finfo(rk.dtype).bits > torch.finfo(k.dtype).bits
    return Read(rk, rv, lengths, window, mask, positions, layer.k_norm if exact else None)


class LayerCache:
    """One layer's keys, values and slot positions. Subclasses say where a position goes (:meth:`slots`),
    which positions stay once ``last`` is written (:meth:`retains`) and which keys a query sees (:meth:`sees`)."""

    kind = "dense"

    def __init__(self, batch: int, heads: int, dim: int, capacity: int, dtype: torch.dtype, device: Any,
                 window: int | None = None):
        self.window = window  # W: keys a token sees, itself included (None: all before it)
        self.k = torch.zeros(batch, heads, capacity, dim, dtype=dtype, device=device)  # (B, H_kv, C, D)
        self.v = torch.zeros_like(self.k)
        self.slot_positions = torch.full((batch, capacity), -1, dtype=torch.long, device=device)  # (B, C)
        self.k_norm = 0.0  # the largest ‖k_j‖ ever appended (an upper bound of the keys held)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def slots(self, pos: torch.Tensor) -> torch.Tensor:
        return pos

    def retains(self, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(pos, dtype=torch.bool)

    def sees(self, kpos: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
        seen = (kpos >= 0) & (kpos <= qpos)
        return seen if self.window is None else seen & (kpos > qpos - self.window)

    def describe(self) -> dict:
        return {"kind": self.kind, "capacity": self.capacity, "window": self.window}

    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        size = max(2 * self.capacity, needed)
        B, H, C, D = self.k.shape
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = old.new_zeros(B, H, size, D)  # (B, H_kv, size, D)
            grown[:, :, :C] = old
            setattr(self, name, grown)
        pos = self.slot_positions.new_full((B, size), -1)
        pos[:, :C] = self.slot_positions
        self.slot_positions = pos

    def write(self, step: Step, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put the real new columns at their slots (those the kind retains once the last is written)."""
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

    def update(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        """Write the new keys and values and say what the step's queries read (dense: the prefix in place)."""
        self._grow(int(step.end.max()))
        self.write(step, k, v)
        tk = max(int(step.end.max()), 1)
        band = None if self.window is None else (self.window - 1, 0)
        return _read(self, self.k[:, :, :tk], self.v[:, :, :tk], step.end, band, None, self.slot_positions[:, :tk], dtype)


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
            n = torch.clamp(step.end, max=self.capacity)  # (B,) filled slots, a prefix of the ring
            tk = int(n.max())
            return _read(self, self.k[:, :, :tk], self.v[:, :, :tk], n, None, None, self.slot_positions[:, :tk], dtype)
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

    def sees(self, kpos: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
        return (kpos >= 0) & (kpos <= qpos) & ((kpos < self.sink) | (kpos > qpos - self.window))

    def describe(self) -> dict:
        return super().describe() | {"sink": self.sink}


def _gathered(layer: LayerCache, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
    """A chunk's read of a ring: the stored keys in position order, then the new ones, from slot 0.

    With the keys contiguous in position (a window's), the band says which a query sees; a sink's
    gap between its first S and its last W positions needs the mask.
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
    read = _read(layer, keys, values, count + step.new, (layer.window - 1, 0), None, kpos, dtype)
    return read if layer.kind == "window" else _with_mask(read, step, layer)


def _with_mask(read: Read, step: Step, layer: LayerCache) -> Read:
    """The read with its visibility as one boolean mask (B, 1, Tq, Tk): each query's position against each key's."""
    qpos = torch.where(step.real, step.positions, -1)  # (B, Tq): padding columns see nothing
    mask = layer.sees(read.key_positions[:, None, :], qpos[:, :, None])  # (B, Tq, Tk)
    return replace(read, window=None, mask=mask[:, None])


def _check_entries(name: str, x: Any, shape: tuple, dtype: torch.dtype, layer: int) -> torch.Tensor:
    """New keys or values, checked once: a tensor of the layer's shape, floating, finite in the cache's dtype."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} for layer {layer} must be a torch tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} for layer {layer} must be [B, H_kv, Tq, D] = {list(shape)}, got {list(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} for layer {layer} must be floating, got {x.dtype}")
    x = x.detach().to(dtype)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} for layer {layer} must be finite in the cache's {dtype} (NaN or Inf found)")
    return x


class KVCache:
    """The keys and values of every layer (a :class:`LayerCache` each) and the per-sequence ``lengths``.

    Build it with :meth:`for_model`; pass it as ``kv_cache=`` to the transformer's forward, which
    (once per call) begins a :class:`Step`, updates every layer and commits the new lengths.
    """

    def __init__(self, layers: list[LayerCache]):
        if not layers:
            raise ValueError("layers must hold at least one LayerCache")
        self.layers = list(layers)
        first = self.layers[0]
        self.lengths = torch.zeros(first.k.shape[0], dtype=torch.long, device=first.k.device)  # (B,)

    @classmethod
    def for_model(cls, config: TransformerConfig, batch: int, *, kind: str = "dense", window: int | None = None,
                  sink: int | None = None, capacity: int | None = None, dtype: Any = torch.float32,
                  device: Any = "cpu") -> KVCache:
        """A cache for ``config``'s layers: each layer's kind from :func:`layer_kinds`; dense layers
        start at ``capacity`` slots (default 256; they double when a write needs more)."""
        kinds = layer_kinds(config, kind, window, sink)
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be an int >= 1 (slots per dense layer) or None, got {capacity!r}")
        dtype = torch_dtype(dtype)
        h, d = config.heads_kv, config.head_dim
        start = capacity or DENSE_START
        layers: list[LayerCache] = []
        for (what, w, s), layer in zip(kinds, range(config.num_layers)):
            if what == "dense":
                layers.append(LayerCache(batch, h, d, start, dtype, device, window=config.layer_window(layer)))
            elif what == "window":
                layers.append(WindowCache(batch, h, d, w, dtype, device))
            else:
                layers.append(SinkCache(batch, h, d, s, w, dtype, device))
        return cls(layers)

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].k.dtype

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(layer.kind for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """The bytes of the keys and values held (every slot of every layer, filled or not)."""
        return sum(layer.nbytes for layer in self.layers)

    def begin(self, new: torch.Tensor, tq: int) -> Step:
        """A step of ``new`` (B,) real tokens per sequence, right-aligned in ``tq`` columns."""
        new = torch.as_tensor(new, dtype=torch.long, device=self.lengths.device)
        if new.shape != self.lengths.shape or bool((new < 0).any()) or bool((new > tq).any()):
            raise ValueError(f"new tokens per sequence must be {self.batch} ints in 0..{tq}, got {new.tolist()}")
        return Step(self.lengths.clone(), new, tq, tq == 1 and bool((new == 1).all()))

    def update(self, layer: int, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype | None = None) -> Read:
        """Append layer ``layer``'s new keys and values [B, H_kv, Tq, D] (rotated) and say what its attention reads."""
        lc = self.layers[layer]
        shape = (self.batch, lc.k.shape[1], step.tq, lc.k.shape[3])
        k = _check_entries("k", k, shape, self.dtype, layer)
        v = _check_entries("v", v, shape, self.dtype, layer)
        lc.k_norm = max(lc.k_norm, max_norm(k))
        return lc.update(step, k, v, dtype or self.dtype)

    def visible(self, layer: int, step: Step, read: Read) -> torch.Tensor:
        """Which keys of ``read`` each of the step's queries sees, (B, 1, Tq, Tk) bool (the eager scores' mask)."""
        return read.mask if read.mask is not None else _with_mask(read, step, self.layers[layer]).mask

    def commit(self, step: Step) -> None:
        """The step is written in every layer: the sequences are ``step.end`` long."""
        self.lengths = step.end

    def check_fits(self, config: TransformerConfig, batch: int, name: str = "kv_cache", device: Any = None) -> None:
        """A cache passed back in must be one of this model's, for this batch: else a ValueError naming ``name``."""
        want = (config.num_layers, config.heads_kv, config.head_dim, batch)
        first = self.layers[0].k.shape
        got = (len(self.layers), first[1], first[3], self.batch)
        if got != want:
            raise ValueError(f"{name} holds {got[0]} layers x {got[1]} k/v heads x head dim {got[2]} for a batch of "
                             f"{got[3]}; this model and input need {want[0]} x {want[1]} x {want[2]} for {want[3]}")
        if device is not None and self.lengths.device != torch.device(device):
            raise ValueError(f"{name} is on {self.lengths.device}; this model runs on {device}")

    def to_dict(self) -> dict:
        return {"kinds": list(self.kinds), "lengths": self.lengths.tolist(), "dtype": str(self.dtype).removeprefix("torch."),
                "nbytes": self.nbytes, "layers": [layer.describe() for layer in self.layers]}


def layer_kinds(config: TransformerConfig, kind: str, window: int | None, sink: int | None) -> list[tuple]:
    """Each layer's (kind, W, S) for a cache of ``kind``.

    dense: every layer dense (a sliding layer reads its band). window: a sliding layer keeps a ring
    of its own W (or of ``window`` when smaller), every other layer a ring of ``window`` (when not
    given: stays dense, so a hybrid model such as Gemma-2 is exact). sink: the sliding layers as for
    window, every other layer ``sink`` first tokens (default 4) plus a ring of ``window``.
    ``window`` is W: the keys a token sees, itself included.
    """
    if kind not in KINDS:
        raise ValueError(f"cache must be one of {', '.join(KINDS)}, got {kind!r}")
    for name, value in (("window", window), ("sink", sink)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
    own = [config.layer_window(layer) for layer in range(config.num_layers)]
    if kind == "dense":
        if window is not None or sink is not None:
            raise ValueError("window= and sink= size a 'window' or 'sink' cache; the dense cache keeps every position")
        return [("dense", None, None)] * config.num_layers
    if kind == "sink" and window is None:
        raise ValueError("window: a 'sink' cache needs window= (the last W positions it keeps beside the sink)")
    if kind == "window" and window is None and all(w is None for w in own):
        raise ValueError(f"window: a {config.family} model has no sliding-window layers; a 'window' cache needs window=")
    if kind == "window" and sink is not None:
        raise ValueError("sink= sizes a 'sink' cache; pass cache='sink'")
    out = []
    for w in own:
        if w is not None:
            out.append(("window", w if window is None else min(w, window), None))
        elif kind == "window":
            out.append(("dense", None, None) if window is None else ("window", window, None))
        else:
            out.append(("sink", window, SINK_DEFAULT if sink is None else sink))
    return out
