"""Quantized KV caches: ``cache_dtype="int8" | "int4" | "fp8"`` (and ``rotate=``), checked before any work.

A :class:`QuantDenseCache` layer is a dense cache (slot = position) that stores codes and scales only
(:class:`~attnlab.transformer.quantize.Store`, in the format of :mod:`attnlab.reference.quantized`); a step reads
them as they are stored, as :class:`~attnlab.reference.quantized.QuantizedKV` values that
:func:`attnlab.attention` takes in place of k and v (blockwise and torch dequantize a block of keys at a time).
Every read is of what is stored, the step's own new entries included (int4 keeps the newest in float).
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.reference.quantized import GROUP, KINDS, RESIDUAL
from attnlab.transformer.config import TransformerConfig
from attnlab.transformer.layer_cache import DenseCache, Read, Step
from attnlab.transformer.quantize import Store
from attnlab.transformer.weights import DTYPES, torch_dtype

QUANTIZED = KINDS  # the cache dtypes that quantize: "int8", "int4", "fp8"


def cache_dtype_of(cache_dtype: Any, rotate: Any, config: TransformerConfig, cache: str) -> Any:
    """``generate``'s cache_dtype as the cache stores it: a quantized kind (a str of :data:`QUANTIZED`) or a torch
    float dtype (None: None, the model's); every refusal names its argument, before any work."""
    if not isinstance(rotate, bool):
        raise TypeError(f"rotate must be True or False, got {rotate!r}")
    if not (isinstance(cache_dtype, str) and cache_dtype in QUANTIZED):
        if rotate:
            raise ValueError(f"rotate=True rotates keys before they are quantized; cache_dtype={cache_dtype!r} does not "
                             f"quantize (rotate goes with cache_dtype {', '.join(map(repr, QUANTIZED))})")
        if cache_dtype is None:
            return None
        if isinstance(cache_dtype, str) and cache_dtype not in DTYPES:
            raise ValueError(f"cache_dtype must be one of {', '.join(DTYPES + QUANTIZED)}, got {cache_dtype!r}")
        return torch_dtype(cache_dtype, "cache_dtype")
    d = config.head_dim
    if cache != "dense":
        raise ValueError(f"cache_dtype={cache_dtype!r} quantizes a dense cache; cache={cache!r} is not served quantized "
                         "(use cache='dense', or a float cache_dtype)")
    if cache_dtype == "int4" and d % GROUP:
        raise ValueError(f"cache_dtype='int4' groups {GROUP} channels of a value; this model's head width {d} is not "
                         f"divisible by {GROUP}")
    if rotate and d & (d - 1):
        raise ValueError(f"rotate=True: the Hadamard rotation needs a head width that is a power of two; this model's "
                         f"is {d} (no block-Hadamard: pass rotate=False)")
    return cache_dtype


def check_backend(backend: str, cache_dtype: Any) -> None:
    """A quantized cache is read by the backends that declare the feature (auto finds one): a named backend
    that does not is refused before any work."""
    from attnlab.backends.dispatch import BACKENDS

    def reads(b: Any) -> bool:
        return "quantized" in b.supports.features and cache_dtype in b.quantized_kinds

    if cache_dtype in QUANTIZED and backend != "auto" and backend in BACKENDS and not reads(BACKENDS[backend]):
        readers = [n for n, b in BACKENDS.items() if reads(b)]
        raise ValueError(f"backend {backend!r} does not read a quantized cache (cache_dtype={cache_dtype!r}); "
                         f"use auto or {' or '.join(readers)}")


class QuantDenseCache(DenseCache):
    """A dense layer whose keys and values are stored quantized (``self.k``, ``self.v``: :class:`Store`)."""

    def __init__(self, batch: int, heads: int, dim: int, capacity: int, quantized: str, dtype: torch.dtype,
                 device: Any, window: int | None = None, rotate: bool = False):
        self.window, self.cache_dtype = window, quantized
        self.k = Store(quantized, batch, heads, dim, capacity, dtype, device, grouping="channel", rotate=rotate)
        self.v = Store(quantized, batch, heads, dim, capacity, dtype, device, grouping="token")
        self.slot_positions = torch.full((batch, self.k.shape[2]), -1, dtype=torch.long, device=device)  # (B, C)
        self.k_norm = 0.0

    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        size = max(2 * self.capacity, needed)
        self.k.grow(size)
        self.v.grow(size)
        B, C = self.slot_positions.shape
        pos = self.slot_positions.new_full((B, self.k.shape[2]), -1)
        pos[:, :C] = self.slot_positions
        self.slot_positions = pos

    def write(self, step: Step, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k.write(step, k)
        self.v.write(step, v)
        if step.decode and step.even:
            self.slot_positions[:, int(step.start[0])] = step.start
            return
        b, col = step.real.nonzero(as_tuple=True)  # (N,), (N,)
        self.slot_positions[b, step.positions[b, col]] = step.positions[b, col]

    def update(self, step: Step, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> Read:
        """Write the new entries as codes and say what the step reads: the codes as stored, slots 0..longest − 1."""
        self._grow(step.longest)
        self.write(step, k, v)
        tk = max(step.longest, 1)
        lengths = None if step.even else step.end
        return Read(self.k.read(tk), self.v.read(tk), lengths, self.visibility(), self.slot_positions[:, :tk])

    def describe(self) -> dict:
        out = super().describe() | {"cache_dtype": self.cache_dtype, "rotate": self.k.rotate}
        if self.cache_dtype == "int4":
            out |= {"group": GROUP, "residual": RESIDUAL}
        if self.cache_dtype == "fp8":
            out |= {"saturated": self.k.saturated + self.v.saturated}
        return out


def layers(config: TransformerConfig, batch: int, kinds: list[tuple], quantized: str, capacity: int,
           dtype: torch.dtype, device: Any, rotate: bool) -> list[QuantDenseCache]:
    """Every layer of a quantized cache (dense layers only: :func:`cache_dtype_of` refused the others)."""
    if any(kind != "dense" for kind, _, _ in kinds):
        raise ValueError(f"cache_dtype={quantized!r} quantizes dense layers only, got layers {kinds} (kind, W, S)")
    return [QuantDenseCache(batch, config.heads_kv, config.head_dim, capacity, quantized, dtype, device,
                            window=config.layer_window(layer), rotate=rotate) for layer in range(config.num_layers)]
