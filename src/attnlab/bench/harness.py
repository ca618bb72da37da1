"""What attention costs: time and memory of each way of computing it, as the context grows.

One implementation behind ``attnlab bench``, ``benchmarks/bench_attention.py`` and the lesson's
cost figures (:func:`measure`). Methods run interleaved (every method once per round, in a new
seeded order each round) so that load from other processes falls on all of them alike; the time is
the median of the rounds, a call under ``MIN_TIMING_S`` timed over several in a row.

- FLOPs: 4·n²·d per head (two GEMMs), half of it for causal; GFLOP/s and the percentage of the
  GEMM rate measured for the same shapes (``gemm``: the two GEMMs alone, in row chunks, float32,
  the machine's ceiling for this arithmetic).
- Peak extra memory: the peak resident set size during the call minus the resident size before
  (Linux: ``/proc/self/clear_refs`` resets the peak, ``malloc_trim`` returns freed heap first), so
  NumPy, torch and BLAS buffers count alike; 0 where ``/proc`` cannot say.
- Error: the largest absolute difference from the float64 reference on up to 64 query rows.
- A method is skipped, with its reason, where its estimated memory exceeds the budget or its
  estimated time (from the last size) exceeds ``max_seconds``.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import time
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from attnlab.backends import kernel, online
from attnlab.spec import reference
from attnlab.backends.api import attention
from attnlab.spec.masks import band_mask

METHODS = ("naive", "numpy", "torch", "sdpa", "blockwise-numpy", "blockwise-torch", "auto", "gemm")
NUMPY_METHODS = ("naive", "numpy", "blockwise-numpy")  # the rest run on torch
# After a call, OpenBLAS's idle workers spin (sched_yield) for ~0.1 s and torch's OpenMP threads
# for a few ms; on 2 cores the next method, if it runs on the other library, then loses a core
# (blockwise-torch timed right after blockwise-numpy took 2x its time alone). So when the library
# changes the loop pauses, then makes one untimed call (threads asleep for 0.3 s wake slowly: a
# 1 ms call timed right after the pause took 3-8 ms).
SWITCH_PAUSE_S = 0.3
MIN_TIMING_S = 0.05  # a call shorter than this is timed over several calls in a row (timeit's autorange)
WARM_CALL_S = 1.0  # and a call shorter than this gets one untimed call before the first round
TORCH_METHODS = ("torch", "sdpa", "blockwise-torch")  # what auto chooses among for tensors
ERROR_ROWS = 64


def naive_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The seed's code ("In code", seed 000), as printed: one sequence, no mask."""

    def softmax(x):  # noqa: ANN001, ANN202
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    d = K.shape[-1]
    scores = Q @ K.T
    if scale:
        scores = scores / np.sqrt(d)
    weights = softmax(scores)
    return weights @ V, weights


@dataclass(frozen=True)
class BenchConfig:
    """One sweep. The defaults finish in a few minutes on 2 cores; flags extend it to n = 65 536."""

    sizes: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    heads: tuple[int, ...] = (1, 12)
    causal: tuple[bool, ...] = (False, True)
    d: int = 64
    methods: tuple[str, ...] = METHODS
    repeats: int = 3
    memory_mb: float = 4096.0  # skip a method whose estimated extra memory exceeds this
    max_seconds: float = 30.0  # skip a method whose estimated time per call exceeds this
    threads: int | None = None  # torch intra-op threads while measuring (None: torch's default)
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"methods must be among {', '.join(METHODS)}, got {', '.join(bad)}")
        for name in ("sizes", "heads"):
            vals = getattr(self, name)
            if not vals or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in vals):
                raise ValueError(f"{name} must be ints >= 1, got {vals!r}")
        if self.repeats < 1 or self.d < 1:
            raise ValueError(f"repeats and d must be >= 1, got repeats={self.repeats}, d={self.d}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"threads must be None or an int >= 1, got {self.threads!r}")
        if self.memory_mb <= 0 or self.max_seconds <= 0:
            raise ValueError(f"memory_mb and max_seconds must be > 0, got {self.memory_mb}, {self.max_seconds}")


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
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def flops(n: int, d: int, heads: int, causal: bool) -> float:
    return 4.0 * n * n * d * heads * (0.5 if causal else 1.0)


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _probe(fn: Callable[[], Any]) -> tuple[Any, float, int | None]:
    """Run ``fn`` once: (its result, seconds, peak extra resident bytes or None).

    Freed heap memory is first handed back to the system, so that buffers the call reuses from
    an earlier call count too; that makes the call slower, so timed calls do not go through here.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident size (VmHWM) to the current one
        before = _status_kb("VmRSS")
    except OSError:
        before = None
    t0 = time.perf_counter()
    res = fn()
    dt = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    extra = None if before is None or peak is None else max(0, peak - before) * 1024
    return res, dt, extra


def _inputs(n: int, d: int, heads: int, seed: int, dtype: str = "float32") -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((heads, n, d), dtype=np.dtype(dtype)) for _ in range(3))  # (H, n, d)
    return {"np": (q, k, v)}


def _estimate_bytes(method: str, n: int, d: int, heads: int) -> float:
    """Extra memory a method needs, roughly, to decide what to skip before trying it."""
    nn = float(n) * n * heads
    lin = 6.0 * n * d * heads * 4  # float32 copies of q, k, v (with their extra column), the output
    bq, bk = online.block_sizes(heads, n)
    tile = min(bq * bk * heads, nn) * 4  # the kernel's float32 score tile (band masks are bool, a quarter of it, edge tiles only)
    return {
        "naive": nn * 4 * 3, "numpy": nn * 8 * 4, "torch": nn * 4 * 3,
        "sdpa": lin, "blockwise-numpy": lin + tile, "blockwise-torch": lin + tile, "auto": lin + tile,
        "gemm": lin + tile,
    }[method]


def _runner(method: str, data: dict[str, Any], causal: bool) -> tuple[Callable[[], Any], str | None]:
    """A zero-argument call computing ``method`` on the inputs, and why it cannot run (or None)."""
    q, k, v = data["np"]
    if method == "naive":
        if causal:
            return (lambda: None), "the seed's code has no mask"
        return (lambda: np.stack([naive_attention(q[h], k[h], v[h])[0] for h in range(q.shape[0])])), None
    if method in ("numpy", "blockwise-numpy"):
        name = method.removesuffix("-numpy")
        return (lambda: attention(q, k, v, causal=causal, backend=name)), None
    import torch

    if "torch" not in data:
        data["torch"] = tuple(torch.from_numpy(x) for x in (q, k, v))
    tq, tk, tv = data["torch"]
    if method == "gemm":
        def gemm() -> Any:  # the attention's two GEMMs on blockwise's tiles, without the softmax
            h, n = tq.shape[0], tq.shape[1]
            bq, bk = online.block_sizes(h, n)
            kt = tk.transpose(-1, -2)
            out = torch.zeros_like(tv)
            s = torch.empty(h, bq, bk)
            for i in range(0, n, bq):
                for j in range(0, n, bk):
                    whole = i + bq <= n and j + bk <= n  # a ragged edge tile gets its own buffer
                    tile = torch.matmul(tq[:, i : i + bq], kt[:, :, j : j + bk], out=s if whole else None)
                    out[:, i : i + bq].baddbmm_(tile, tv[:, j : j + bk])
            return out
        return gemm, None
    name = {"blockwise-torch": "blockwise"}.get(method, method)
    return (lambda: attention(tq, tk, tv, causal=causal, backend=name)), None


def _error(out: Any, data: dict[str, Any], causal: bool) -> float:
    q, k, v = data["np"]
    n = q.shape[1]
    rows = np.unique(np.linspace(0, n - 1, min(n, ERROR_ROWS)).astype(int))
    mask = band_mask(n, n, right=0, rows=rows) if causal else None  # those rows only: n² would not fit at 65 536
    exact = reference.attention(q[:, rows].astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask=mask)
    got = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    return float(np.abs(got[:, rows].astype(np.float64) - exact).max())


def _auto_choice(data: dict[str, Any], causal: bool) -> str:
    from attnlab.backends.request import prepare
    from attnlab.backends.dispatch import choose

    tq, tk, tv = data["torch"]
    call = prepare(tq, tk, tv, mask=None, bias=None, causal=causal, scale=None, window=None, lengths=None,
                   return_weights=False, weights_rows=None, return_lse=False, block_size=None)
    return choose(call.request).name


def run_config(
    n: int, d: int, heads: int, causal: bool, methods: tuple[str, ...], repeats: int, *,
    memory_mb: float = 4096.0, skip: dict[str, str] | None = None, seed: int = 0,
    tick: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """Every method on one (n, d, heads, causal), interleaved over ``repeats`` rounds."""
    data = _inputs(n, d, heads, seed)
    skip = dict(skip or {})
    _warm_up(tuple(m for m in methods if m not in skip), d, causal)
    calls: dict[str, Callable[[], Any]] = {}
    for m in methods:
        if m in skip:
            continue
        fn, why = _runner(m, data, causal)  # a method that cannot do the call says so first
        need = _estimate_bytes(m, n, d, heads)
        if why is None and need > memory_mb * 2**20:
            why = f"needs ~{need / 2**20:,.0f} MB > budget {memory_mb:,.0f} MB"
        if why:
            skip[m] = why
        else:
            calls[m] = fn
    times, peaks, errors = _interleaved(
        calls, lambda m, out: _error(out, data, causal) if m != "gemm" else None, repeats, _probe, tick)
    f = flops(n, d, heads, causal)
    gemm_rate = 4.0 * n * n * d * heads / float(np.median(times["gemm"])) if "gemm" in times else None
    chose = _auto_choice(data, causal) if "auto" in calls else None
    res = []
    for m in methods:
        if m in skip:
            res.append(Measurement(m, n, d, heads, causal, None, skipped=skip[m]))
            continue
        t = float(np.median(times[m]))
        rate = (4.0 * n * n * d * heads if m == "gemm" else f) / t
        res.append(Measurement(
            m, n, d, heads, causal, t, tuple(times[m]), peaks[m], errors[m], rate / 1e9,
            None if gemm_rate is None else 100.0 * rate / gemm_rate, chose if m == "auto" else None,
        ))
    return res


def _interleaved(
    calls: dict[Any, Callable[[], Any]], error: Callable[[Any, Any], float | None], repeats: int,
    probe: Callable[[Callable[[], Any]], tuple[Any, float, int | None]], tick: Callable[[Any], None] | None = None,
) -> tuple[dict[Any, list[float]], dict[Any, int | None], dict[Any, float | None]]:
    """The measuring loop: one untimed ``probe`` call per key (peak memory, and ``error`` of its
    output), then ``repeats`` rounds of timed calls, every key once per round, in a new (seeded)
    order each round.

    Keys are methods (:func:`run_config`) or sizes (:func:`measure_sweep`): interleaving spreads the
    machine's other load over all of them alike, so their ratios suffer less from it; the shuffled
    order keeps a disturbance that outlasts one call from always falling on the same neighbours
    (in a fixed order, the two calls after the 1.2 GB float64 reference at n = 2048, 12 heads, were
    slowed by 40 % in three rounds of five).
    """
    times: dict[Any, list[float]] = {key: [] for key in calls}
    peaks: dict[Any, int | None] = {}
    errors: dict[Any, float | None] = {}
    seconds: dict[Any, float] = {}  # of the probe call
    with _no_grad():
        for key, fn in calls.items():
            out, seconds[key], peaks[key] = probe(fn)
            errors[key] = error(key, out)
            del out
        number = {key: max(1, min(50, math.ceil(MIN_TIMING_S / max(t, 1e-6)))) for key, t in seconds.items()}  # per timing
        time.sleep(SWITCH_PAUSE_S)  # the errors were computed with NumPy: its idle BLAS threads stop spinning
        for key, fn in calls.items():  # the probes handed freed memory back: fault it in again, untimed
            if seconds[key] < WARM_CALL_S:
                fn()
        last, items, order = None, list(calls.items()), np.random.default_rng(0)
        for _ in range(repeats):
            for i in order.permutation(len(items)):
                key, fn = items[i]
                lib = "numpy" if key in NUMPY_METHODS else "torch"
                if last is not None and lib != last:
                    time.sleep(SWITCH_PAUSE_S)  # the other library's idle threads stop spinning (untimed)
                    fn()  # and this one's wake up (untimed)
                last = lib
                t0 = time.perf_counter()
                for _ in range(number[key]):
                    fn()
                times[key].append((time.perf_counter() - t0) / number[key])
                if tick:
                    tick(key)
    return times, peaks, errors


def _probe_traced(fn: Callable[[], Any]) -> tuple[Any, float, int | None]:
    """Like :func:`_probe`, but the peak is what ``tracemalloc`` sees above the start of the call.

    tracemalloc counts the buffers of NumPy arrays (NumPy reports them to it) and Python objects,
    to the byte and on any OS; it does not see torch's or BLAS's own allocations.
    """
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        res = fn()
        dt = time.perf_counter() - t0
        return res, dt, int(tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()


_WARM: set[tuple[str, int, bool]] = set()


def _warm_up(methods: tuple[str, ...], d: int, causal: bool) -> None:
    """One small untimed call per method: library start-up (torch import, BLAS set-up) is not its cost."""
    data = _inputs(256, d, 1, 0)
    for m in methods:
        if (m, d, causal) not in _WARM:
            fn, why = _runner(m, data, causal)
            if why is None:
                fn()
            _WARM.add((m, d, causal))


class _no_grad:
    """torch.no_grad() when torch is loaded (a benchmark measures inference), nothing otherwise."""

    def __enter__(self) -> None:
        import sys

        self._ctx = sys.modules["torch"].no_grad() if "torch" in sys.modules else None
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def measure(method: str, n: int, d: int = 64, heads: int = 1, causal: bool = False, repeats: int = 3, *,
            memory: str = "rss", blas_threads: int | None = None, seed: int = 0, dtype: str = "float32") -> Measurement:
    """Time, peak extra memory and error of one method at one size: :func:`measure_sweep` at one n."""
    return measure_sweep(method, (n,), d, heads, causal, repeats, memory=memory, blas_threads=blas_threads, seed=seed,
                         dtype=dtype)[0]


MEMORY = ("rss", "tracemalloc")  # how peak extra memory is measured: _probe, _probe_traced


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
    bench``) or float64 (the NumPy reference's own precision). The GEMM ceiling is not measured alongside, so
    ``pct_of_gemm`` is None. Nothing is skipped for its size: the caller chooses the sizes.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
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
        _warm_up((method,), d, causal)
        data = {n: _inputs(n, d, heads, seed, dtype) for n in sizes}
        runners = {n: _runner(method, data[n], causal) for n in sizes}
        calls = {n: fn for n, (fn, why) in runners.items() if why is None}
        times, peaks, errors = _interleaved(
            calls, lambda n, out: _error(out, data[n], causal) if method != "gemm" else None, repeats,
            _probe if memory == "rss" else _probe_traced)
    res = []
    for n in sizes:
        if n not in calls:
            res.append(Measurement(method, n, d, heads, causal, None, skipped=runners[n][1]))
            continue
        t = float(np.median(times[n]))
        f = 4.0 * n * n * d * heads if method == "gemm" else flops(n, d, heads, causal)
        res.append(Measurement(method, n, d, heads, causal, t, tuple(times[n]), peaks[n], errors[n], f / t / 1e9))
    return res


@dataclass(frozen=True)
class BenchResult:
    config: BenchConfig
    machine: dict[str, Any]
    measurements: list[Measurement] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "machine": self.machine,
                "measurements": [m.to_dict() for m in self.measurements], "targets": targets(self.measurements)}


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and how busy it was."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                            "numpy": np.__version__, "load_average": os.getloadavg(),
                            "blockwise_kernel": kernel.isa() or "Python loop (not compiled)"}
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    except ImportError:
        pass
    return info


def run(config: BenchConfig, tick: Callable[[str], None] | None = None) -> BenchResult:
    """The sweep: sizes in increasing order, each (heads, causal) config interleaved inside."""
    with _threads(config.threads):
        start = machine()
        found = _sweep(config, tick)
    start["load_average_end"] = os.getloadavg()
    return BenchResult(config, start, found)


class _threads:
    """torch.set_num_threads(n) for the block, restored after (nothing for None)."""

    def __init__(self, n: int | None) -> None:
        self.n, self.before = n, None

    def __enter__(self) -> None:
        if self.n is not None:
            import torch

            self.before = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: Any) -> None:
        if self.before is not None:
            import torch

            torch.set_num_threads(self.before)


def _sweep(config: BenchConfig, tick: Callable[[str], None] | None) -> list[Measurement]:
    found: list[Measurement] = []
    last: dict[tuple, Measurement] = {}
    for n in sorted(config.sizes):
        for heads in config.heads:
            for causal in config.causal:
                skip = {}
                for m in config.methods:  # predict from the last size: time and memory grow at most as n²
                    prev = last.get((m, heads, causal))
                    if prev is not None and prev.time_s is not None:
                        guess = prev.time_s * (n / prev.n) ** 2
                        mem = (prev.peak_bytes or 0) * (n / prev.n) ** 2 / 2**20
                        if guess > config.max_seconds:
                            skip[m] = f"would take ~{guess:,.0f} s > {config.max_seconds:g} s per call"
                        elif mem > config.memory_mb:
                            skip[m] = f"may need ~{mem:,.0f} MB (n² from the last size) > budget {config.memory_mb:,.0f} MB"
                res = run_config(n, config.d, heads, causal, config.methods, config.repeats,
                                 memory_mb=config.memory_mb, skip=skip, seed=config.seed, tick=tick)
                for r in res:
                    if r.time_s is not None:
                        last[(r.method, heads, causal)] = r
                found += res
    return found


def targets(ms: list[Measurement]) -> dict[str, list[dict[str, Any]]]:
    """The issue's targets as ratios measured in the same run (no verdict is hidden: each row says)."""
    by = {(m.method, m.n, m.heads, m.causal): m for m in ms if m.time_s is not None}
    out: dict[str, list[dict[str, Any]]] = {"blockwise_vs_sdpa": [], "causal_saving": [], "memory_65536": [], "auto_vs_fastest": []}
    for (meth, n, h, c), m in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0])):
        if meth == "blockwise-torch" and not c and n >= 2048 and ("sdpa", n, h, False) in by:
            r = m.time_s / by["sdpa", n, h, False].time_s
            out["blockwise_vs_sdpa"].append({"n": n, "heads": h, "ratio": r, "met": r <= 1.3})
        if meth == "blockwise-torch" and c and n >= 8192 and ("blockwise-torch", n, h, False) in by:
            saving = 1 - m.time_s / by["blockwise-torch", n, h, False].time_s
            sd = by.get(("sdpa", n, h, True))
            out["causal_saving"].append({"n": n, "heads": h, "saving": saving, "met": saving >= 0.45,
                                         "vs_sdpa_causal": None if sd is None else m.time_s / sd.time_s})
        if meth == "blockwise-torch" and n == 65536 and h == 1 and m.peak_bytes is not None:
            out["memory_65536"].append({"causal": c, "peak_mb": m.peak_bytes / 2**20, "met": m.peak_bytes < 64 * 2**20})
        if meth == "auto":
            rivals = [by[x, n, h, c].time_s for x in TORCH_METHODS if (x, n, h, c) in by]
            if rivals:
                r = m.time_s / min(rivals)
                chosen = by.get(({"blockwise": "blockwise-torch"}.get(m.backend, m.backend), n, h, c))
                out["auto_vs_fastest"].append({
                    "n": n, "heads": h, "causal": c, "chose": m.backend, "ratio": r, "met": r <= 1.1,
                    # the chosen backend's own median against the fastest: the choice, without auto's timing noise
                    "choice_ratio": None if chosen is None else chosen.time_s / min(rivals),
                })
    return out
