"""auto's measurements: how long each backend takes on *this* machine, measured once and cached.

``auto`` ranks the backends that fit a call by what they cost here, not by constants fitted on
another machine. For a call of a common kind (no dense mask, bias or padding; full attention or
square causal; or decoding, a few query rows against a long cache, padded or not; on the CPU) it
looks up the *profile* of the call (input library, dtype, head dim, the number of (batch, head)
pairs, causal, gradients; decoding: the query rows and heads per k/v head) in a small table of
timings measured at a few sizes, the first time such a call is large enough for the choice to
matter, and interpolates the time at the call's number of scores (log-log). The head count is the
call's own: how the backends rank depends on how much of q, k and v stays in the caches, which one
head of 8 192 tokens and twelve heads of 2 048 do not share, so a table measured at one count
misranks calls at another. Calls of other kinds, and small ones, are ranked by each
backend's rough prior (:meth:`attnlab.backends.base.Backend.estimate`).

The table is cached as JSON in ``$ATTNLAB_CACHE_DIR`` (default ``$XDG_CACHE_HOME/attnlab``, else
``~/.cache/attnlab``), in a file keyed by the CPU, the thread count, NumPy's, torch's and attnlab's
versions and the instruction sets in use (the compiled kernel's; ``ATEN_CPU_CAPABILITY`` and
``MKL_ENABLE_INSTRUCTIONS`` where set): another machine or an upgrade measures anew.
``ATTNLAB_CALIBRATE=0`` turns measuring off (auto then uses the priors alone); ``attnlab check
--calibrate`` measures the usual profiles again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.backends.request import Request

log = logging.getLogger(__name__)

ENV_SWITCH = "ATTNLAB_CALIBRATE"
ENV_CACHE = "ATTNLAB_CACHE_DIR"
MIN_SCORES = 1 << 16  # smaller calls take microseconds: the priors rank them
HEAD_DIMS = (32, 64, 128, 256)  # a call's head dim is measured as the nearest of these
SCORES = (1 << 16, 1 << 20, 1 << 24, 1 << 26)  # the sizes measured, in scores (heads · n²): one head's n = 256 … 8 192
MIN_N = 16  # many heads: the smallest n measured
MAX_HEADS = 256  # calls of more (batch, head) pairs are measured with this many (their caches overflow alike)
PRUNE = 4.0  # a backend this many times slower than the best at a size (past the first) is not measured at larger ones
REPEATS = 3  # timings per point; the fastest is kept (a busy machine only ever adds time)
MIN_TIMING_S = 0.005  # calls shorter than this are timed over several in a row


# Decoding: a few query rows against a long cache. Such a call's profile keeps its query rows (rounded up
# to a power of 2, at most DECODE_TQ) and its query heads per k/v head, and is measured against caches
# of DECODE_KEYS keys, those of at most DECODE_MAX_BYTES of keys and values (the largest beyond a
# last-level cache, so its figure is a read from memory), at least two.
DECODE_TQ = 32
DECODE_KEYS = (1024, 4096, 16384, 65536)
DECODE_MAX_BYTES = 1 << 27


@dataclass(frozen=True)
class Profile:
    """The kind of call a timing table is for."""

    library: str
    dtype: str
    d: int
    heads: int  # (batch, head) pairs of the call
    causal: bool
    grad: bool
    tq: int = 0  # decoding: the query rows (0: self-attention, Tq = Tk)
    groups: int = 1  # decoding: query heads per key/value head
    sinks: bool = False  # learned sink logits (gpt-oss): measured with them, as only the backends that serve them

    def key(self) -> str:
        key = f"{self.library}/{self.dtype}/d{self.d}/h{self.heads}/{'causal' if self.causal else 'full'}/{'grad' if self.grad else 'fwd'}"
        return key + (f"/decode-tq{self.tq}-g{self.groups}" if self.tq else "") + ("/sinks" if self.sinks else "")

    def sizes(self) -> tuple[int, ...]:
        """The key lengths measured (:func:`sizes` for self-attention; cache lengths for decoding)."""
        if not self.tq:
            return sizes(self.heads)
        item = 2 if self.dtype in ("float16", "bfloat16") else np.dtype(self.dtype).itemsize
        fit = [n for n in DECODE_KEYS if self.heads // self.groups * n * 2 * self.d * item <= DECODE_MAX_BYTES]
        return tuple(DECODE_KEYS[: max(2, len(fit))])

    def scores(self, n: int) -> int:
        return self.heads * (self.tq or n) * n


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def profile(r: Request) -> Profile | None:
    """The profile of ``r``, or None where auto uses the priors (small, masked, windowed, GPU calls; padded
    ones other than decoding's, whose cache lengths are about its Tk). Learned sinks have profiles of their
    own, measured with sinks: the backends that serve them differ (not SDPA) and so may their ranking."""
    p = r.problem
    if (r.scores < MIN_SCORES or r.device != "cpu" or r.mask or r.bias or p.d != p.dv or r.structure or r.mask_mod
            or r.score_mod or r.alibi):
        return None  # a window's (a document's, …) cost depends on its width, which no table holds
    d = min(HEAD_DIMS, key=lambda h: abs(math.log(h / p.d)))
    heads = min(int(np.prod(p.batch, dtype=np.int64)), MAX_HEADS)
    if p.tq <= DECODE_TQ < p.tk:
        heads = max(p.groups, heads // p.groups * p.groups)
        return Profile(r.library, r.dtype, d, heads, r.causal, r.grad, 1 << (p.tq - 1).bit_length(), p.groups,
                       r.sinks)
    if r.lengths or p.groups != 1 or (r.causal and p.tq != p.tk):
        return None
    return Profile(r.library, r.dtype, d, heads, r.causal, r.grad, sinks=r.sinks)


def sizes(heads: int) -> tuple[int, ...]:
    """The sequence lengths measured for ``heads`` (batch, head) pairs: n with heads · n² near each of
    :data:`SCORES`, a multiple of 16 (the kernel's tiles), at least :data:`MIN_N`."""
    ns = (max(MIN_N, 16 * round(math.sqrt(s / heads) / 16)) for s in SCORES)
    return tuple(sorted(set(ns)))


def cache_path() -> Path:
    root = os.environ.get(ENV_CACHE) or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "attnlab")
    return Path(root) / f"calibration-{machine_key()[:16]}.json"


@functools.cache
def machine_facts() -> dict[str, Any]:
    """What the timings depend on: the CPU, threads, library versions, the kernel's instruction set.

    Read once per process (package metadata and /proc/cpuinfo are slow to read at every call).
    """
    from importlib import metadata

    from attnlab.backends import kernel

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for dist in ("numpy", "torch", "attnlab"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    # the environment variables that change which instructions torch's and MKL's kernels use
    isa_env = {name: os.environ.get(name) for name in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    return {"cpu": cpu, "machine": platform.machine(), "cpus": os.cpu_count(),
            "omp_threads": os.environ.get("OMP_NUM_THREADS"), "kernel_isa": kernel.isa(), **isa_env, **versions}


@functools.cache
def machine_key() -> str:
    return hashlib.sha256(json.dumps(machine_facts(), sort_keys=True).encode()).hexdigest()


class Table:
    """Timings by profile and backend: [(scores, seconds), …], loaded from and saved to the cache file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_path()
        self.profiles: dict[str, dict[str, list[list[float]]]] = {}
        try:
            data = json.loads(self.path.read_text())
            if data.get("machine") == machine_facts():
                self.profiles = data.get("profiles", {})
        except (OSError, ValueError, AttributeError):
            pass

    def save(self) -> None:
        data = {"machine": machine_facts(), "profiles": self.profiles}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as f:
                json.dump(data, f, indent=1)
            os.replace(f.name, self.path)
        except OSError as e:  # a read-only home: the timings live for this process only
            log.warning("could not save auto's calibration to %s: %s", self.path, e)


_TABLE: Table | None = None
_GENERATION = 0  # counts changes of the measurements: whoever caches a choice made from them keys it by this


def generation() -> int:
    return _GENERATION


def table() -> Table:
    global _TABLE
    if _TABLE is None or _TABLE.path != cache_path():
        _TABLE = Table()
    return _TABLE


def estimate(points: list[list[float]], scores: float) -> float:
    """Seconds at ``scores`` from measured (scores, seconds) points: linear in log-log between them.

    Beyond the largest point the time grows at least in proportion to the scores (attention does
    work for each one: a slope below 1 there is per-call overhead, which larger calls outgrow);
    below the smallest it falls no faster than in proportion.
    """
    pts = sorted(points)
    x = math.log(scores)
    if len(pts) == 1:
        return pts[0][1] * scores / pts[0][0]
    xs, ys = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    if x > xs[-1]:
        return float(math.exp(ys[-1] + max(slope, 1.0) * (x - xs[-1])))
    if x < xs[0]:
        slope = min(max(slope, 0.0), 1.0)
    return float(math.exp(ys[i] + slope * (x - xs[i])))


def _timer(fn: Callable[[], Any]) -> float:
    """Seconds per call of fn: over several calls in a row when one is short."""
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    reps = max(1, int(MIN_TIMING_S / max(one, 1e-9)))
    if reps == 1:
        return one
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _inputs(prof: Profile, n: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(0)
    dtype = "float32" if prof.dtype == "bfloat16" else prof.dtype
    kv = (1, prof.heads // prof.groups, n, prof.d)  # (1, H_kv, n, D)
    shapes = ((1, prof.heads, prof.tq or n, prof.d), kv, kv)
    qkv = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    if prof.library == "torch":
        import torch

        qkv = [torch.from_numpy(x).to(getattr(torch, prof.dtype)).requires_grad_(prof.grad) for x in qkv]
    return tuple(qkv)


def _sink_logits(prof: Profile) -> Any:
    """The profile's learned sink logits, one per query head (H,) in its library and dtype, or None."""
    if not prof.sinks:
        return None
    sinks = np.random.default_rng(1).standard_normal(prof.heads).astype("float32" if prof.dtype == "bfloat16" else prof.dtype)
    if prof.library == "torch":
        import torch

        return torch.from_numpy(sinks).to(getattr(torch, prof.dtype))
    return sinks


def measure(prof: Profile, names: list[str], run: Callable[[str, tuple, bool], Any]) -> dict[str, list[list[float]]]:
    """Time each backend of ``names`` on the profile's sizes (interleaved per size, pruned as they fall behind).

    ``run(name, (q, k, v), causal, sink_logits)`` makes one call (the dispatcher passes its own; the sink
    logits are None but for a profile with sinks).
    """
    points: dict[str, list[list[float]]] = {name: [] for name in names}
    alive = list(names)
    ns = prof.sizes()
    sinks = _sink_logits(prof)
    for n in ns:
        q, k, v = _inputs(prof, n)
        scores = prof.scores(n)

        def call(name: str) -> Callable[[], Any]:
            def go() -> None:
                out = run(name, (q, k, v), prof.causal, sinks)
                if prof.grad:
                    out.sum().backward()
            return go

        times: dict[str, list[float]] = {name: [] for name in alive}
        for name in alive:
            call(name)()  # warm: first-call costs are not the backend's
        for _ in range(REPEATS):
            for name in alive:
                times[name].append(_timer(call(name)))
        best = min(min(t) for t in times.values())
        for name, t in times.items():
            points[name].append([scores, min(t)])
        if n != ns[0]:  # the smallest size measures per-call overheads, not the rate
            alive = [name for name in alive if min(times[name]) <= PRUNE * best]
    return points


def timings(r: Request, names: list[str], run: Callable[[str, tuple, bool], Any]) -> dict[str, float] | None:
    """Each backend's measured seconds for ``r`` on this machine (measuring its profile first if needed), or None."""
    global _GENERATION
    prof = profile(r) if enabled() else None
    if prof is None:
        return None
    tab = table()
    measured = tab.profiles.get(prof.key(), {})
    missing = [n for n in names if n not in measured]
    if missing:
        log.info("auto: measuring %s for %s on this machine (once; cached in %s)", ", ".join(missing), prof.key(), tab.path)
        measured = {**measured, **measure(prof, missing, run)}
        tab.profiles[prof.key()] = measured
        tab.save()
        _GENERATION += 1
    return {n: estimate(measured[n], r.scores) for n in names}


def forget() -> Path:
    """Drop the cached table (``attnlab check --calibrate`` measures again); returns its path."""
    global _TABLE
    global _GENERATION
    path = cache_path()
    path.unlink(missing_ok=True)
    _TABLE = None
    _GENERATION += 1
    return path
