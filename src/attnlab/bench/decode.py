"""Decoding's benchmark (``attnlab bench --decode``, ``benchmarks/bench_decode.py``): one query row per
head against a long key/value cache, where the work is reading the cache.

Per cache length and dtype, the time of one step (the median of the interleaved rounds,
:func:`attnlab.bench.timing.interleaved`), the GB/s of keys and values read (counted as stored:
B·H_kv·Tk·(D + Dv)·bytes per item) and that as a share of this machine's read bandwidth, measured
in the same run (:func:`read_bandwidth`). The methods:

- ``attention``: ``attnlab.attention(q, k, v, causal=True, backend="kernel")``, a plain call (it
  checks q for NaN/Inf first, and k and v in the decode pass that reads them);
- ``generate``: the read attnlab's ``generate`` makes at each step, through the same
  :class:`~attnlab.backends.reads.Reads` (auto's choice kept per length bucket, the chosen decode
  pass called directly) with the keywords of the cache's read (:data:`GENERATE_KWARGS`: causal, the
  entries checked when written and the largest key length, no lengths as every sequence holds all
  n keys; k, v the filled prefix of a cache one slot longer), ``backend="auto"``;
- ``pass``: the kernel's decode pass alone (``_tiles.decode`` on arguments prepared before the
  rounds: q as float32, k and v as stored, the output buffers), so ``generate`` minus ``pass`` is
  what attnlab's Python costs a step, cold, as a step meets it;
- ``tiles``: the kernel's many-row path (``block_size=kernel.BLOCK`` forces it; a float32 copy of a
  16-bit cache);
- ``sdpa-gqa``: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)``;
- ``sdpa-repeated``: the same with k and v repeated to H heads beforehand, untimed.

Where one cache fits in the last-level cache, each method cycles through several caches whose total
is at least twice it, so that every step reads from memory.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from attnlab.bench.sweep import machine, memory_available
from attnlab.bench.timing import interleaved, torch_threads

DECODE_METHODS = ("attention", "generate", "pass", "tiles", "sdpa-gqa", "sdpa-repeated")
# with k_norm=: cache.Read.kwargs() of a step where every sequence holds the n keys read (no lengths needed)
GENERATE_KWARGS = {"lengths": None, "causal": True, "mask": None, "kv_checked": True}
STORED = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DecodeConfig:
    """One decode sweep: B = ``batch``, H = ``heads``, H_kv = ``kv_heads``, D = Dv = ``d``, Tq = 1."""

    lengths: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536, 131072)
    dtypes: tuple[str, ...] = STORED
    methods: tuple[str, ...] = DECODE_METHODS
    batch: int = 1
    heads: int = 32
    kv_heads: int = 8
    d: int = 128
    repeats: int = 5
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("lengths",):
            vals = getattr(self, name)
            if not vals or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in vals):
                raise ValueError(f"{name} must be ints >= 1, got {vals!r}")
        for name, allowed in (("dtypes", STORED), ("methods", DECODE_METHODS)):
            bad = [x for x in getattr(self, name) if x not in allowed]
            if bad or not getattr(self, name):
                raise ValueError(f"{name} must be among {', '.join(allowed)}, got {', '.join(bad) or 'none'}")
        for name in ("batch", "heads", "kv_heads", "d", "repeats"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads must be a multiple of kv_heads, got {self.heads} and {self.kv_heads}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"threads must be None or an int >= 1, got {self.threads!r}")

    def cache_bytes(self, n: int, dtype: str) -> int:
        """Bytes of one cache's keys and values, as stored."""
        return self.batch * self.kv_heads * n * 2 * self.d * (4 if dtype == "float32" else 2)


@dataclass(frozen=True)
class DecodeMeasurement:
    method: str
    dtype: str
    n: int
    time_s: float | None  # median over the rounds; None when skipped
    gbs: float | None = None  # GB/s of k and v read, as stored
    pct_of_bandwidth: float | None = None
    vs_sdpa: float | None = None  # the faster SDPA's time over this one's (> 1: faster than SDPA)
    vs_tiles: float | None = None
    caches: int = 1  # caches cycled through
    backend: str | None = None  # what auto chose (method "generate")
    skipped: str | None = None


@dataclass(frozen=True)
class DecodeResult:
    config: DecodeConfig
    machine: dict[str, Any]
    bandwidth_gbs: float
    llc_bytes: int
    measurements: list[DecodeMeasurement] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "machine": self.machine, "bandwidth_gbs": self.bandwidth_gbs,
                "llc_bytes": self.llc_bytes, "measurements": [asdict(m) for m in self.measurements]}


def llc_bytes() -> int:
    """The last-level cache's size (Linux sysfs; 32 MiB where it cannot be read)."""
    import glob

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
            sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError):
            pass
    return max(sizes, default=32 << 20)


def read_bandwidth(llc: int, repeats: int = 5, median: bool = False) -> float:
    """GB/s of a STREAM-like read: torch's threads summing a float32 buffer of 8 times the last-level cache, the
    fastest of ``repeats`` reads (``median``: their median, as steady as the medians it is set beside)."""
    import torch

    x = torch.ones(max(8 * llc, 256 << 20) // 4)
    x.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return x.numel() * 4 / (statistics.median(times) if median else min(times)) / 1e9


def run(cfg: DecodeConfig, tick: Any = None) -> DecodeResult:
    """Every method of ``cfg`` at each (dtype, cache length), after measuring the read bandwidth."""
    with torch_threads(cfg.threads):
        llc = llc_bytes()
        bandwidth = read_bandwidth(llc)
        found = []
        for dtype in cfg.dtypes:
            for n in cfg.lengths:
                found += _one(cfg, dtype, n, llc, bandwidth, tick)
    return DecodeResult(cfg, machine(), bandwidth, llc, found)


def _caches(cfg: DecodeConfig, dtype: str, n: int, count: int) -> list[tuple]:
    """``count`` (q, k, v): k and v the first n slots of a cache of n + 1, as attnlab's KV cache holds them,
    q in their dtype (SDPA's) and as float32 (attnlab's: a float32 model's query over a 16-bit cache)."""
    import torch

    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(n)
    out = []
    for _ in range(count):
        q = torch.randn(cfg.batch, cfg.heads, 1, cfg.d, generator=gen).to(dt)  # (B, H, 1, D)
        k, v = (cache_like(torch.randn(cfg.batch, cfg.kv_heads, n + 1, cfg.d, generator=gen), dt)[:, :, :n] for _ in "kv")
        out.append((q, q.float(), k, v))  # k, v (B, H_kv, n, D) views
    return out


def cache_like(x: Any, dtype: Any) -> Any:
    """``x`` in ``dtype``, held as attnlab's KV cache holds its keys and values (on huge pages where the OS
    lends them: :mod:`attnlab.backends.pages`)."""
    from attnlab.backends import pages

    return pages.zeros(tuple(x.shape), dtype).copy_(x)


def _pass_args(q: Any, k: Any, v: Any) -> tuple:
    """``_tiles.decode``'s first five arguments for (q, k, v): q as float32, k and v as stored, out and lse."""
    import numpy as np

    from attnlab.backends import kernel

    b, h, tq, _ = q.shape
    out, lse = np.empty((b, h, tq, v.shape[-1]), np.float32), np.empty((b, h, tq), np.float32)
    return kernel._buffers(q)[0], kernel._stored(k), kernel._stored(v), out, lse


def _calls(cfg: DecodeConfig, caches: list[tuple], n: int, repeated_fits: bool) -> dict[str, Any]:
    """Each method's call, cycling through the caches (SDPA's over q in the cache's dtype)."""
    import torch.nn.functional as F

    from attnlab.backends import kernel
    from attnlab.backends.api import attention
    from attnlab.backends.reads import Reads
    from attnlab.reference.validate import dtype_name

    reads = Reads("auto")  # one layer's reads, as generate() keeps them
    stored = dtype_name(caches[0][2])
    g = cfg.heads // cfg.kv_heads
    step = _generate_kwargs(caches[0][2])
    repeated = [(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) for q, _, k, v in caches] if repeated_fits else []
    ours, theirs = [(q32, k, v) for _, q32, k, v in caches], [(q, k, v) for q, _, k, v in caches]
    turn = {"i": 0}

    def cycling(fn: Any, sets: list[tuple]) -> Any:
        def call() -> Any:
            turn["i"] += 1
            return fn(*sets[turn["i"] % len(sets)])
        return call

    calls = {
        "attention": lambda q, k, v: attention(q, k, v, causal=True, backend="kernel"),
        "generate": lambda q, k, v: reads(0, q, k, v, step),
        "pass": lambda *args: (kernel._tiles.decode(*args, stored, cfg.d ** -0.5, 0), args[3])[1],  # out
        "tiles": lambda q, k, v: attention(q, k, v, causal=True, backend="kernel", block_size=kernel.BLOCK),
        "sdpa-gqa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "sdpa-repeated": F.scaled_dot_product_attention,
    }
    bare = [_pass_args(*c) for c in ours] if "pass" in cfg.methods else []
    sets = {"sdpa-gqa": theirs, "sdpa-repeated": repeated, "pass": bare}
    return {m: cycling(fn, sets.get(m, ours)) for m, fn in calls.items()
            if m in cfg.methods and (m != "sdpa-repeated" or repeated_fits)}


def _generate_kwargs(k: Any) -> dict[str, Any]:
    """The keywords of generate's call at a step over the cached keys ``k``, every sequence holding all of
    them (its largest key length as the cache keeps it)."""
    from attnlab.backends.request import max_norm

    return {"k_norm": max_norm(k), **GENERATE_KWARGS}


def _one(cfg: DecodeConfig, dtype: str, n: int, llc: int, bandwidth: float, tick: Any) -> list[DecodeMeasurement]:
    from attnlab.backends.dispatch import explain
    from attnlab.backends.options import Options
    from attnlab.backends.request import prepare

    size = cfg.cache_bytes(n, dtype)
    count = min(64, max(1, math.ceil(2 * llc / size)))
    free = memory_available()
    g = cfg.heads // cfg.kv_heads
    repeated_fits = free is None or count * size * (1 + g) < free / 2
    caches = _caches(cfg, dtype, n, count)
    calls = _calls(cfg, caches, n, repeated_fits)
    times, _, _ = interleaved(calls, lambda key, out: None, cfg.repeats, tick=tick)
    median = {m: statistics.median(t) for m, t in times.items()}
    sdpa = min((median[m] for m in ("sdpa-gqa", "sdpa-repeated") if m in median), default=None)
    _, q32, k, v = caches[0]
    chosen = explain(prepare(q32, k, v, Options(**_generate_kwargs(k))).request).backend
    found = []
    for m in cfg.methods:
        if m not in median:
            found.append(DecodeMeasurement(m, dtype, n, None, skipped="k and v repeated to H heads need more memory than "
                                                                    "half of what is available"))
            continue
        t = median[m]
        found.append(DecodeMeasurement(
            m, dtype, n, t, size / t / 1e9, 100 * size / t / 1e9 / bandwidth, None if sdpa is None else sdpa / t,
            median["tiles"] / t if "tiles" in median else None, count, chosen if m == "generate" else None))
    return found
