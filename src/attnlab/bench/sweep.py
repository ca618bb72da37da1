"""The sweeps: every method at each (n, heads, causal) of a :class:`BenchConfig` (``attnlab bench``),
or one method over several sizes (:func:`measure_sweep`, the lesson's cost section).

What each number is:

- time: the median of the rounds (:func:`attnlab.bench.timing.interleaved`);
- GFLOP/s: :func:`attnlab.bench.methods.flops` over the time; ``pct_of_gemm``: that rate over the
  rate of the ``gemm`` method on the same shapes in the same run (the machine's ceiling for this
  arithmetic; above 100 % a fused method beat two separate GEMMs);
- peak extra memory: of one untimed call (:mod:`attnlab.bench.timing`); the output included;
- error: the largest absolute difference from the float64 reference on up to 64 query rows;
- for ``auto``: the backend it chose and why (:func:`attnlab.backends.dispatch.explain`), asked
  before timing, so that any measuring auto does on this machine is not timed.

A method is skipped, with its reason, where it refuses the call, where its estimated memory
exceeds the budget, or where its time, extrapolated as n² from the last size, exceeds ``max_seconds``.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from attnlab.backends import kernel
from attnlab.bench import methods as M
from attnlab.bench.timing import MEMORY, interleaved, probe, probe_traced, torch_threads


MAX_SIZE = 65536  # the largest n attnlab bench takes: beyond it the naive methods' n × n alone is > 16 GB


def memory_available() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable, else physical memory; None if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def input_bytes(n: int, d: int, heads: int) -> int:
    """What one configuration holds before any method runs: float32 q, k, v and one output, (heads, n, d) each."""
    return 4 * heads * n * d * 4


@dataclass(frozen=True)
class BenchConfig:
    """One sweep. The defaults are a short sweep; flags extend it to n = 65 536
    (:data:`MAX_SIZE`). A configuration whose inputs alone would not fit in the memory available
    is refused here, before anything is allocated."""

    sizes: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    heads: tuple[int, ...] = (1, 12)
    causal: tuple[bool, ...] = (False, True)
    d: int = 64
    methods: tuple[str, ...] = M.METHODS
    repeats: int = 3
    memory_mb: float = 4096.0  # skip a method whose estimated extra memory exceeds this
    max_seconds: float = 30.0  # skip a method whose estimated time per call exceeds this
    threads: int | None = None  # torch intra-op threads while measuring (None: torch's default)
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in M.METHODS]
        if bad or not self.methods:
            raise ValueError(f"methods must be among {', '.join(M.METHODS)}, got {', '.join(bad) or 'none'}")
        for name in ("sizes", "heads"):
            vals = getattr(self, name)
            if not vals or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in vals):
                raise ValueError(f"{name} must be ints >= 1, got {vals!r}")
        if not self.causal or any(not isinstance(c, bool) for c in self.causal):
            raise ValueError(f"causal must be a non-empty tuple of True/False, got {self.causal!r}")
        if self.repeats < 1 or self.d < 1:
            raise ValueError(f"repeats and d must be >= 1, got repeats={self.repeats}, d={self.d}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"threads must be None or an int >= 1, got {self.threads!r}")
        if self.memory_mb <= 0 or self.max_seconds <= 0:
            raise ValueError(f"memory_mb and max_seconds must be > 0, got {self.memory_mb}, {self.max_seconds}")
        if max(self.sizes) > MAX_SIZE:
            raise ValueError(f"sizes go up to {MAX_SIZE} (n × n at n = {MAX_SIZE} is already 16 GB in float32), "
                             f"got {max(self.sizes)}")
        need, free = input_bytes(max(self.sizes), self.d, max(self.heads)), memory_available()
        if free is not None and need > free:
            raise ValueError(f"n = {max(self.sizes)}, {max(self.heads)} heads, d = {self.d}: q, k, v and the output "
                             f"alone need {need / 2**30:,.1f} GiB, and {free / 2**30:,.1f} GiB of memory is available")


@dataclass(frozen=True)
class Measurement:
    method: str
    n: int
    d: int
    heads: int
    causal: bool
    time_s: float | None  # median over repeats; None when skipped
    times_s: tuple[float, ...] = ()
    peak_bytes: int | None = None  # peak extra resident memory during a call
    max_error: float | None = None  # vs float64, on up to 64 query rows
    gflops: float | None = None
    pct_of_gemm: float | None = None
    backend: str | None = None  # what "auto" chose
    reason: str | None = None  # and why (measured on this machine, or the backends' priors)
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchResult:
    config: BenchConfig
    machine: dict[str, Any]
    measurements: list[Measurement] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "machine": self.machine,
                "measurements": [m.to_dict() for m in self.measurements]}


def kernel_info() -> Any:
    """What the compiled kernel was built with: ``kernel.build_info()`` where it exists, else its
    instruction set (``kernel.isa()``), or a sentence when it was not built."""
    info = getattr(kernel, "build_info", None)
    found = info() if callable(info) else kernel.isa()
    return found if found else "not built (blockwise, the Python loop, serves its calls)"


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and how busy it was."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                            "numpy": np.__version__, "load_average": os.getloadavg(), "kernel": kernel_info()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    except ImportError:
        pass
    return info


def run_config(
    n: int, d: int, heads: int, causal: bool, methods: tuple[str, ...], repeats: int, *,
    memory_mb: float = 4096.0, skip: dict[str, str] | None = None, seed: int = 0,
    tick: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """Every method on one (n, d, heads, causal), interleaved over ``repeats`` rounds."""
    data = M.inputs(n, d, heads, seed)
    skip = dict(skip or {})
    M.warm_up(tuple(m for m in methods if m not in skip), d, causal)
    calls: dict[str, Callable[[], Any]] = {}
    for m in methods:
        if m in skip:
            continue
        fn, why = M.runner(m, data, causal)  # a method that cannot do the call says so first
        need = M.estimate_bytes(m, n, d, heads)
        if why is None and need > memory_mb * 2**20:
            why = f"needs ~{need / 2**20:,.0f} MB > budget {memory_mb:,.0f} MB"
        if why:
            skip[m] = why
        else:
            calls[m] = fn
    choice = None
    if "auto" in calls:  # before any timing: auto may measure the backends on this machine first
        choice = M.auto_choice(data, causal)
        calls["auto"]()  # one untimed call through auto itself
    times, peaks, errors = interleaved(
        calls, lambda m, out: M.error(out, data, causal) if m != "gemm" else None, repeats, probe, tick, M.library)
    f = M.flops(n, d, heads, causal)
    full = M.flops(n, d, heads, False)  # gemm computes every tile, causal or not
    gemm_rate = full / float(np.median(times["gemm"])) if "gemm" in times else None
    res = []
    for m in methods:
        if m in skip:
            res.append(Measurement(m, n, d, heads, causal, None, skipped=skip[m]))
            continue
        t = float(np.median(times[m]))
        rate = (full if m == "gemm" else f) / t
        auto = m == "auto" and choice is not None
        res.append(Measurement(
            m, n, d, heads, causal, t, tuple(times[m]), peaks[m], errors[m], rate / 1e9,
            None if gemm_rate is None else 100.0 * rate / gemm_rate,
            choice.backend if auto else None, choice.reason if auto else None,
        ))
    return res


def _predicted_skips(config: BenchConfig, last: dict[tuple, Measurement], n: int, heads: int, causal: bool) -> dict[str, str]:
    """Methods to skip at ``n``, predicted from their last size: time and memory grow at most as n²."""
    skip = {}
    for m in config.methods:
        prev = last.get((m, heads, causal))
        if prev is None or prev.time_s is None:
            continue
        guess = prev.time_s * (n / prev.n) ** 2
        mem = (prev.peak_bytes or 0) * (n / prev.n) ** 2 / 2**20
        if guess > config.max_seconds:
            skip[m] = f"would take ~{guess:,.0f} s > {config.max_seconds:g} s per call"
        elif mem > config.memory_mb:
            skip[m] = f"may need ~{mem:,.0f} MB (n² from the last size) > budget {config.memory_mb:,.0f} MB"
    return skip


def run(config: BenchConfig, tick: Callable[[str], None] | None = None) -> BenchResult:
    """The sweep: sizes in increasing order, each (heads, causal) config's methods interleaved."""
    found: list[Measurement] = []
    last: dict[tuple, Measurement] = {}
    with torch_threads(config.threads):
        start = machine()
        for n in sorted(config.sizes):
            for heads in config.heads:
                for causal in config.causal:
                    res = run_config(n, config.d, heads, causal, config.methods, config.repeats,
                                     memory_mb=config.memory_mb, skip=_predicted_skips(config, last, n, heads, causal),
                                     seed=config.seed, tick=tick)
                    last.update({(r.method, heads, causal): r for r in res if r.time_s is not None})
                    found += res
    start["load_average_end"] = os.getloadavg()
    return BenchResult(config, start, found)


def measure(method: str, n: int, d: int = 64, heads: int = 1, causal: bool = False, repeats: int = 3, *,
            memory: str = "rss", blas_threads: int | None = None, seed: int = 0, dtype: str = "float32") -> Measurement:
    """Time, peak extra memory and error of one method at one size: :func:`measure_sweep` at one n."""
    return measure_sweep(method, (n,), d, heads, causal, repeats, memory=memory, blas_threads=blas_threads, seed=seed,
                         dtype=dtype)[0]


def measure_sweep(
    method: str, sizes: Iterable[int], d: int = 64, heads: int = 1, causal: bool = False, repeats: int = 3, *,
    memory: str = "rss", blas_threads: int | None = None, seed: int = 0, dtype: str = "float32",
) -> list[Measurement]:
    """One method at several sizes, interleaved over the sizes (for the lesson's cost figures).

    Every n once, then every n again, …: the machine's other load falls on all sizes alike, so the
    ratios between sizes (a fitted growth exponent) suffer less from it. ``memory``: ``"rss"``
    (peak resident set, sees every allocation; Linux only, else None) or ``"tracemalloc"`` (what
    NumPy and Python allocate, to the byte, on any OS). ``blas_threads`` limits NumPy's BLAS while
    measuring (threadpoolctl; None leaves it). ``dtype`` of the inputs: float32 (as ``attnlab
    bench``) or float64 (the NumPy reference's own precision). The GEMM ceiling is not measured
    alongside, so ``pct_of_gemm`` is None. Nothing is skipped for its size: the caller chooses the sizes.
    """
    M.check_method(method)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    if memory not in MEMORY:
        raise ValueError(f"memory must be one of {', '.join(MEMORY)}, got {memory!r}")
    if blas_threads is not None and (isinstance(blas_threads, bool) or not isinstance(blas_threads, int) or blas_threads < 1):
        raise ValueError(f"blas_threads must be None or an int >= 1, got {blas_threads!r}")
    sizes = tuple(sizes)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes must be ints >= 1, got {sizes!r}")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=blas_threads, user_api="blas"):
        M.warm_up((method,), d, causal)
        data = {n: M.inputs(n, d, heads, seed, dtype) for n in sizes}
        runners = {n: M.runner(method, data[n], causal) for n in sizes}
        calls = {n: fn for n, (fn, why) in runners.items() if why is None}
        times, peaks, errors = interleaved(
            calls, lambda n, out: M.error(out, data[n], causal) if method != "gemm" else None, repeats,
            probe if memory == "rss" else probe_traced)
    res = []
    for n in sizes:
        if n not in calls:
            res.append(Measurement(method, n, d, heads, causal, None, skipped=runners[n][1]))
            continue
        t = float(np.median(times[n]))
        f = M.flops(n, d, heads, causal and method != "gemm")  # gemm computes every tile, causal or not
        res.append(Measurement(method, n, d, heads, causal, t, tuple(times[n]), peaks[n], errors[n], f / t / 1e9))
    return res
