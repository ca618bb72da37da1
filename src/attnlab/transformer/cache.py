"""The key/value cache of attnlab's transformer: what decoding keeps of every token before the new ones.

The layout is the one :func:`attnlab.attention` (and the compiled decode kernel) reads: per layer,
contiguous keys and values ``[B, H_kv, capacity, D]``, zero in every slot no token was written to,
and per sequence ``lengths`` (B,), the tokens written so far (the same for every layer). New tokens
are written at each sequence's own offset, so a batch of prompts of unequal length is one cache.
A layer keeps one of three kinds, dense, window and sink (:mod:`attnlab.transformer.layer_cache`).

Entries are validated once, when appended (shape, dtype, finite, after the cast to the cache's
dtype), and each layer keeps the largest key length ‖k_j‖ it was given; the attention calls that
read them then skip the scan of the whole cache (``kv_checked=True, k_norm=``). A read is one call
``attnlab.attention(q, k, v, lengths=, causal=True, mask=)`` (the layer's window, or sink tokens and window, as attnlab.masks): causal with lengths is each sequence's
own (query i of sequence b at lengths[b] − Tq + i), which is how a step's new tokens are placed.
A cache may hold a narrower dtype than the weights (``cache_dtype``, e.g. bfloat16 under float32):
a float32 query reads a float16 or bfloat16 cache as stored (attention() takes that mix); any other
is read back in the query's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnlab.backends.request import max_norm
from attnlab.transformer import quant_cache
from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.evict_cache import POLICIES, EvictingCache, evict_kinds
from attnlab.transformer.layer_cache import (
    DENSE_START, SINK_DEFAULT, DenseCache, LayerCache, Read, SinkCache, Step, WindowCache,
)
from attnlab.transformer.latent_cache import LatentCache
from attnlab.transformer.weights import torch_dtype

KINDS = ("dense", "window", "sink", *POLICIES)


def _check_entries(name: str, x: Any, shape: tuple, dtype: torch.dtype, layer: int) -> torch.Tensor:
    """New keys or values, checked once: a tensor of the layer's shape, floating; in the cache's dtype (their
    finiteness is :func:`_finite_norm`'s)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} for layer {layer} must be a torch tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} for layer {layer} must be [B, H_kv, Tq, D] = {list(shape)}, got {list(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} for layer {layer} must be floating, got {x.dtype}")
    return x.detach().to(dtype)


def _finite_norm(k: torch.Tensor, v: torch.Tensor, layer: int) -> float:
    """The largest key length ‖k_j‖, with the finite check of k and v folded in (one reduction each): NaN or
    Inf in k makes that length non-finite (max_norm recomputes an overflow in float64), and in v its largest
    |entry|."""
    norm = max_norm(k)
    for name, bad in (("k", not math.isfinite(norm)),
                      ("v", v.numel() and not math.isfinite(float(torch.linalg.vector_norm(v, ord=math.inf))))):
        if bad:
            raise ValueError(f"{name} for layer {layer} must be finite in the cache's {v.dtype} (NaN or Inf found)")
    return norm


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
                  device: Any = "cpu", budget: int | None = None, seed: int = 0, rotate: bool = False,
                  model_dtype: Any = torch.float32) -> KVCache:
        """A cache for ``config``'s layers: each layer's kind from :func:`layer_kinds`; dense layers
        start at ``capacity`` slots (default 256; they double when a write needs more); an evicting
        kind keeps ``budget`` per layer and k/v head (``seed``: the random policy's generator). ``dtype``
        "int8", "int4" or "fp8": quantized dense layers (:mod:`attnlab.transformer.quant_cache`; entries in
        ``model_dtype``, keys Hadamard-rotated with ``rotate``)."""
        kinds = layer_kinds(config, kind, window, sink, budget)
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be an int >= 1 (slots per dense layer) or None, got {capacity!r}")
        if quant_cache.cache_dtype_of(dtype, rotate, config, kind) in quant_cache.QUANTIZED:
            return cls(quant_cache.layers(config, batch, kinds, dtype, capacity or DENSE_START,
                                          torch_dtype(model_dtype, "model_dtype"), device, rotate))
        dtype = torch_dtype(dtype)
        h, d = _kv_shape(config)
        start = capacity or DENSE_START
        layers: list[LayerCache] = []
        for (what, w, s), layer in zip(kinds, range(config.num_layers)):
            if what == "latent":  # MLA: the latent and the rotary key, one row per token for every head
                layers.append(LatentCache(batch, d, start, dtype, device))
            elif what == "dense":
                layers.append(DenseCache(batch, h, d, start, dtype, device, window=config.layer_window(layer)))
            elif what in POLICIES:
                layers.append(EvictingCache(batch, h, d, budget, s, w, what, dtype, device, seed))
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
    def cache_dtype(self) -> str:
        """What the cache stores: a float dtype's name, or the quantized kind ("int8", "int4", "fp8")."""
        return getattr(self.layers[0], "cache_dtype", None) or str(self.dtype).removeprefix("torch.")

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
        lc.k_norm = max(lc.k_norm, _finite_norm(k, v, layer))
        return lc.update(step, k, v, dtype or self.dtype)

    def commit(self, step: Step) -> None:
        """The step is written in every layer: the sequences are ``step.end`` long."""
        self.lengths = step.end

    def check_fits(self, config: TransformerConfig, batch: int, name: str = "kv_cache", device: Any = None) -> None:
        """A cache passed back in must be one of this model's, for this batch: else a ValueError naming ``name``."""
        want = (config.num_layers, *_kv_shape(config), batch)
        first = self.layers[0].k.shape
        got = (len(self.layers), first[1], first[3], self.batch)
        if got != want:
            raise ValueError(f"{name} holds {got[0]} layers x {got[1]} k/v heads x head dim {got[2]} for a batch of "
                             f"{got[3]}; this model and input need {want[0]} x {want[1]} x {want[2]} for {want[3]}")
        if device is not None and self.lengths.device != torch.device(device):
            raise ValueError(f"{name} is on {self.lengths.device}; this model runs on {device}")

    def to_dict(self) -> dict:
        return {"kinds": list(self.kinds), "lengths": self.lengths.tolist(), "dtype": self.cache_dtype,
                "nbytes": self.nbytes, "layers": [layer.describe() for layer in self.layers]}


def _kv_shape(config: TransformerConfig) -> tuple[int, int]:
    """(k/v heads, width) of a layer's cache: MLA keeps one row of kv_rank + rope_dim for every head."""
    return (config.heads_kv, config.head_dim) if config.latent is None else (1, config.latent.cached)


def layer_kinds(config: TransformerConfig, kind: str, window: int | None, sink: int | None,
                budget: int | None = None) -> list[tuple]:
    """Each layer's (kind, W, S) for a cache of ``kind``.

    dense: every layer dense (a sliding layer reads its band). window: a sliding layer keeps a ring
    of its own W (or of ``window`` when smaller), every other layer a ring of ``window`` (when not
    given: stays dense, so a hybrid model such as Gemma-2 is exact). sink: the sliding layers as for
    window, every other layer ``sink`` first tokens (default 4) plus a ring of ``window``.
    ``window`` is W: the keys a token sees, itself included. An evicting kind (h2o, snapkv, knorm,
    random): :func:`~attnlab.transformer.evict_cache.evict_kinds` (``window`` its recent positions).
    """
    if kind not in KINDS:
        raise ValueError(f"cache must be one of {', '.join(KINDS)}, got {kind!r}")
    if config.latent is not None and kind != "dense":
        raise ValueError(f"cache={kind!r}: a {config.family} model (latent attention) keeps its latent cache "
                         "of every position (cache='dense'); window, sink and evicting caches are not "
                         "implemented for it")
    if kind in POLICIES:
        return evict_kinds(config, kind, window, sink, budget)
    if budget is not None:
        raise ValueError(f"cache_budget={budget!r} sizes an evicting cache ({', '.join(POLICIES)}); cache={kind!r} "
                         "keeps what its kind says")
    for name, value in (("window", window), ("sink", sink)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
    own = [config.layer_window(layer) for layer in range(config.num_layers)]
    if config.latent is not None:  # the latent kind, dense in positions
        if kind != "dense" or window is not None or sink is not None:
            raise ValueError(f"cache={kind!r}: a {config.family} model (latent attention) keeps its latent cache "
                             "of every position (cache='dense', no window= or sink=); window and sink caches "
                             "are not implemented for it")
        return [("latent", None, None)] * config.num_layers
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
