"""The KV cache's stored bytes for the planner: ``cache_dtype=`` (float, or quantized with its scales counted)
and ``cache_budget=`` (an evicting cache's tokens per layer), the names of ``Transformer.generate``.

Bytes per token and k/v head, keys and values together, as the quantized cache stores them (its stored
format, issue 33: codes, scales and zero points, all scales float32):

- float32 / float16 / bfloat16 / float64: 2 · D · itemsize.
- int8 (one scale per token and head, symmetric): 2 · (D + 4).
- int4 (KIVI: groups of 32, keys per channel, values per token, each group a scale and a zero point):
  2 · (D/2 + 8 · D/32) = 1.5 · D; and, whatever the length, the newest R = 128 (+ up to 31) tokens in the
  weights' dtype: 2 · (R + 32) · D · itemsize per sequence and head (the residual ring). D must be divisible by 32.
- fp8 (e4m3, one scale per sequence and head): 2 · D, and 2 · 4 bytes per sequence and head.

A decode step is taken to read exactly the bytes stored (the cache is read as stored, never dequantized
into a copy); the decode attention's measured rate (bytes per second of a float cache) is applied to them,
which assumes the read stays memory-bound: at int4 dequantizing may bind first (the kv benchmark says how close).
"""

from __future__ import annotations

from dataclasses import dataclass

FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
QUANTIZED = ("int8", "int4", "fp8")
INT4_GROUP, INT4_RESIDUAL = 32, 128  # the int4 cache's group and its recent tokens kept in the weights' dtype
SINKS = 4  # an evicting cache's sink tokens by default (attnlab.transformer.layer_cache.SINK_DEFAULT)


@dataclass(frozen=True)
class CacheFormat:
    """``per_token``: bytes per token and k/v head (keys and values); ``fixed``: bytes per sequence and k/v head
    whatever the length; ``budget``: tokens kept per layer (None: every token, or the layer's window)."""

    dtype: str
    per_token: float
    fixed: float = 0
    budget: int | None = None

    def terms(self) -> dict:
        """The keywords of :func:`attnlab.planner.formulas.kv_bytes` for this cache."""
        return {"per_token": self.per_token, "fixed": self.fixed, "budget": self.budget}

    def to_dict(self) -> dict:
        return {"cache_dtype": self.dtype, "bytes_per_token_per_kv_head": self.per_token,
                "fixed_bytes_per_sequence_per_kv_head": self.fixed, "cache_budget": self.budget}


def cache_format(head_dim: int, weights_dtype: str, cache_dtype: str | None, cache_budget: int | None,
                 max_positions: int, latent_width: int | None = None) -> CacheFormat:
    """The cache of a model with head width ``head_dim`` whose weights are ``weights_dtype``; ``cache_dtype``
    None: the weights' dtype (``dtype=`` sets both, ``cache_dtype=`` overrides the cache's part).
    ``latent_width``: latent attention's row (kv_lora_rank + rope_dim numbers per token, for every head), which
    is stored in a float dtype only (attnlab's quantized cache quantizes per-head keys and values)."""
    dtype = weights_dtype if cache_dtype is None else cache_dtype
    known = (*FLOAT_BYTES, *QUANTIZED)
    if dtype not in known:
        raise ValueError(f"cache_dtype must be one of {', '.join(known)}, got {dtype!r}")
    if cache_budget is not None and (isinstance(cache_budget, bool) or not isinstance(cache_budget, int)
                                     or not SINKS < cache_budget <= max_positions):
        raise ValueError(f"cache_budget must be an int from {SINKS + 1} (the {SINKS} sink tokens and the newest) to the "
                         f"model's {max_positions:,} positions, got {cache_budget!r}")
    if latent_width is not None:
        if dtype not in FLOAT_BYTES:
            raise ValueError(f"cache_dtype={dtype!r}: a latent attention cache (one row of {latent_width} numbers "
                             f"for every head) is kept in a float dtype ({', '.join(FLOAT_BYTES)}); the quantized "
                             "formats quantize per-head keys and values")
        return CacheFormat(dtype, latent_width * FLOAT_BYTES[dtype], 0, cache_budget)
    d = head_dim
    if dtype in FLOAT_BYTES:
        return CacheFormat(dtype, 2 * d * FLOAT_BYTES[dtype], 0, cache_budget)
    if dtype == "int8":
        return CacheFormat(dtype, 2 * (d + 4), 0, cache_budget)
    if dtype == "fp8":
        return CacheFormat(dtype, 2 * d, 2 * 4, cache_budget)
    if d % INT4_GROUP:
        raise ValueError(f"cache_dtype='int4' groups {INT4_GROUP} channels; this model's head width {d} is not "
                         f"divisible by {INT4_GROUP}")
    residual = 2 * (INT4_RESIDUAL + INT4_GROUP) * d * FLOAT_BYTES.get(weights_dtype, 2)
    return CacheFormat(dtype, 2 * (d / 2 + 8 * d / INT4_GROUP), residual, cache_budget)
