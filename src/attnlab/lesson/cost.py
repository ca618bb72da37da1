"""Section 6 of the lesson, and `attnlab cost`: what attention costs as the context grows.

The asymptotics (Table 1 of Vaswani et al. 2017) next to measurements: time and peak extra
memory of attention as n doubles, a fitted growth exponent for each (the slope of log cost on
log n), and the largest context n that meets a latency deadline and a memory budget.

Each measured path is a method of :mod:`attnlab.bench`, which does all the measuring (one loop for
``attnlab bench`` and the lesson): float64 inputs, sizes interleaved, time the median of the runs,
memory the peak extra memory of one untimed call. The n × n path is the NumPy reference (float64
inside; it materialises the Tq × Tk weights), the other attnlab's blockwise kernel in NumPy.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

from attnlab import bench
from attnlab.bench import Measurement
from attnlab.lesson.fmt import big, mb, ms, num
from attnlab.lesson.section import Section, table

log = logging.getLogger(__name__)

# Table 1 of Vaswani et al. (2017): per layer, n tokens of d dimensions, kernel k, neighbourhood r.
TABLE_1 = (
    ("Self-attention", "O(n²·d)", "O(1)", "O(1)"),
    ("Recurrent", "O(n·d²)", "O(n)", "O(n)"),
    ("Convolutional", "O(k·n·d²)", "O(1)", "O(log_k(n))"),
    ("Self-attention (restricted)", "O(r·n·d)", "O(1)", "O(n/r)"),
)
MODEL_D = 512  # d for the worked operation counts (the transformer base model)
COUNT_SIZES = (128, 512, 2048, 8192)
SEARCH_STEPS = 4  # bisection steps between the last n that met the limits and the first that did not
SEARCH_GRAIN = 64  # contexts searched are multiples of this
MAX_RUN_S = 2.0  # never start a run predicted to take longer than this (one run, not the repeats)
# Peak extra memory of a call, as tracemalloc sees it: chosen, not defaulted. Both paths are NumPy,
# and every buffer they allocate goes through NumPy, which reports it to tracemalloc; so it is the
# call's peak extra memory to the byte, the same on every run and on every OS. The other measure,
# the rise of the process's peak resident set ("rss"), sees BLAS's and the allocator's memory too,
# but only on Linux (None elsewhere, and the lesson must run anywhere), and it adds page and heap
# rounding. Checked against it (benchmarks/README.md, "Figures behind the code's reasons"), rss
# stayed within a fraction of a MB of it on both paths: nothing the algorithms need is hidden from tracemalloc.
MEMORY = "tracemalloc"
# float64 inputs, the reference's own precision: given float32 it converts them first, a cost that is
# not the attention's and that weighs most at the smallest n, where it flattens the time exponent.
DTYPE = "float64"
MEMORY_SAYS = "the peak of NumPy's allocations during one call (tracemalloc)"


@dataclass(frozen=True)
class CostConfig:
    """The limits the user sets (``--deadline-ms``, ``--memory-mb``) and the sweep's shape."""

    deadline_ms: float = 50.0
    memory_mb: float = 256.0
    d: int = 64
    # From 512: below it fixed per-call costs flatten the time exponent of the n × n path (1.7 with 256).
    sizes: tuple[int, ...] = (512, 1024, 2048, 4096)
    repeats: int = 5
    seed: int = 0
    # BLAS threads while measuring (bench.measure_sweep's blas_threads). One by default: on a shared
    # machine a multi-threaded matmul waits for its slowest thread, and that noise, not n, would set
    # the fitted exponent. None leaves the library's default (all cores).
    blas_threads: int | None = 1

    def __post_init__(self) -> None:
        for name in ("deadline_ms", "memory_mb"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"repeats must be an int >= 1, got {self.repeats!r}")
        if self.blas_threads is not None and not (isinstance(self.blas_threads, int) and self.blas_threads >= 1):
            raise ValueError(f"blas_threads must be None or an int >= 1, got {self.blas_threads!r}")
        if len(self.sizes) < 2 or any((not isinstance(n, int)) or n < 2 for n in self.sizes):
            raise ValueError(f"sizes must hold at least two ints >= 2, got {self.sizes!r}")


# name → (what it is, the attnlab.bench method that computes it). One place to add a path.
PATHS: dict[str, tuple[str, str]] = {
    "n×n (NumPy reference)": ("materialises the n × n weights (float64 inside)", "numpy"),
    "blockwise (NumPy)": ("online softmax over tiles of the default size: never holds n × n", "blockwise-numpy"),
}


def _measure(method: str, sizes, cfg: CostConfig) -> list[Measurement]:
    """``method`` at ``sizes`` (interleaved) as the lesson measures it: cfg's d, repeats, BLAS threads, seed."""
    return bench.measure_sweep(method, sizes, cfg.d, repeats=cfg.repeats, memory=MEMORY,
                               blas_threads=cfg.blas_threads, seed=cfg.seed, dtype=DTYPE)


def growth_exponent(ns, values) -> float:
    """Slope of log(value) on log(n): 2 for cost ∝ n², 1 for cost ∝ n."""
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


def _predict(points: list[Measurement], n: int, attr: str) -> float:
    """Power-law prediction from the measured points (used only to avoid hopeless runs)."""
    ns = [p.n for p in points]
    vals = [max(getattr(p, attr), 1e-12) for p in points]
    slope, icpt = np.polyfit(np.log(ns), np.log(vals), 1)
    return float(np.exp(icpt + slope * np.log(n)))


def largest_context(method: str, cfg: CostConfig, points: list[Measurement]) -> dict:
    """The largest n (a multiple of SEARCH_GRAIN) whose measured time and memory meet the limits.

    Doubles n past the sweep while it fits, then bisects. A size whose predicted memory exceeds
    twice the budget, or whose predicted time exceeds MAX_RUN_S, is not run: it counts as failing,
    and the result says so.
    """
    deadline_s, budget = cfg.deadline_ms / 1000, cfg.memory_mb * 1e6
    tried: dict[int, dict] = {}

    def fits(n: int) -> bool:
        if n in tried:
            return tried[n]["fits"]
        mem_pred, time_pred = _predict(points, n, "peak_bytes"), _predict(points, n, "time_s")
        if mem_pred > 2 * budget or time_pred > MAX_RUN_S:
            tried[n] = {"n": n, "measured": False, "fits": False, "time_s": time_pred, "peak_bytes": mem_pred}
            return False
        m = next((p for p in points if p.n == n), None) or _measure(method, (n,), cfg)[0]
        ok = m.time_s <= deadline_s and m.peak_bytes <= budget
        tried[n] = dict(m.to_dict(), measured=True, fits=ok)
        return ok

    lo, hi = 0, None
    n = min(p.n for p in points)
    while hi is None:
        if fits(n):
            lo, n = n, 2 * n
        else:
            hi = n
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) // 2 // SEARCH_GRAIN * SEARCH_GRAIN
        if mid <= lo or mid >= hi:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    best = tried.get(lo)
    return {"n": lo, "first_failing_n": hi, "at_best": best, "tried": sorted(tried.values(), key=lambda r: r["n"])}


def _measured_table(name: str, path: dict, cfg: CostConfig):
    """Every size this path ran at (sweep and search), with the exponent of each doubling."""
    rows = {pt["n"]: dict(pt, measured=True) for pt in path["points"]}
    for r in path["largest_context"]["tried"]:
        rows.setdefault(r["n"], r)
    out = []
    for r in sorted(rows.values(), key=lambda r: r["n"]):
        fits = r["time_s"] * 1000 <= cfg.deadline_ms and r["peak_bytes"] <= cfg.memory_mb * 1e6
        half = rows.get(r["n"] // 2) if r["n"] % 2 == 0 else None
        slope = (f"{np.log2(r['time_s'] / half['time_s']):.2f} / {np.log2(r['peak_bytes'] / max(half['peak_bytes'], 1)):.2f}"
                 if half and half.get("measured") and r.get("measured") else "")
        approx = "" if r.get("measured") else "≈ "
        out.append([r["n"], approx + ms(r["time_s"]), approx + mb(r["peak_bytes"]), slope,
                    ("yes" if fits else "no") + ("" if r.get("measured") else " (predicted, not run)")])
    return table(
        f"Measured: {name}, d = {cfg.d}, {DTYPE} inputs (time: median of {cfg.repeats} runs, the sweep's sizes "
        f"interleaved, {'all' if cfg.blas_threads is None else cfg.blas_threads} BLAS thread(s); memory: {MEMORY_SAYS})",
        ["n", "time", "peak memory", "exponent vs n/2 (time / memory)", f"meets {cfg.deadline_ms:g} ms and {cfg.memory_mb:g} MB"],
        out,
    )


def ns_of(path: dict) -> list[int]:
    return [pt["n"] for pt in path["points"]]


def cost_section(cfg: CostConfig = CostConfig()) -> Section:
    """Section 6; every measurement through :func:`attnlab.bench.measure_sweep`."""
    d = MODEL_D
    counts = [{"n": n, "attention": n * n * d, "recurrent": n * d * d} for n in COUNT_SIZES]
    paths = {}
    for name, (what, method) in PATHS.items():
        log.info("measuring %s at n = %s", name, cfg.sizes)
        points = _measure(method, cfg.sizes, cfg)
        ns = [p.n for p in points]
        paths[name] = {
            "what": what,
            "method": method,
            "points": [p.to_dict() for p in points],
            "time_exponent": growth_exponent(ns, [p.time_s for p in points]),
            "memory_exponent": growth_exponent(ns, [max(p.peak_bytes, 1) for p in points]),
            "memory_measure": MEMORY,
            # what the last step of the sweep added per token: the O(n) part when a fixed buffer dominates
            "bytes_per_token_last_step": (points[-1].peak_bytes - points[-2].peak_bytes) / (ns[-1] - ns[-2]),
            "largest_context": largest_context(method, cfg, points),
        }
    limits = f"{cfg.deadline_ms:g} ms and {cfg.memory_mb:g} MB"
    findings = [
        f"Per layer, self-attention costs O(n²·d) and a recurrent layer O(n·d²): at d = {d}, attention is cheaper "
        f"while n < d ({big(counts[0]['attention'])} vs {big(counts[0]['recurrent'])} operations at n = {counts[0]['n']}) "
        f"and dearer beyond ({big(counts[-1]['attention'])} vs {big(counts[-1]['recurrent'])} at n = {counts[-1]['n']}). "
        "But a recurrent layer needs O(n) steps one after another and a path of length O(n) between two positions; "
        "attention O(1) of each: it makes good use of parallel hardware, and long contexts are expensive.",
    ]
    for name, p in paths.items():
        best = p["largest_context"]
        findings.append(
            f"{name}, d = {cfg.d}: as n doubles, time grows as n^{p['time_exponent']:.2f} and peak memory as "
            f"n^{p['memory_exponent']:.2f}"
            + (f" (at these sizes a fixed tile buffer dominates; from n = {ns_of(p)[-2]} to {ns_of(p)[-1]} each token "
               f"added {p['bytes_per_token_last_step'] / 1e3:.2g} kB)" if p["memory_exponent"] < 1.5 else "")
            + f"; the largest context meeting {limits} is n = {best['n']}"
            + (f" ({ms(best['at_best']['time_s'])}, {mb(best['at_best']['peak_bytes'])})." if best["at_best"] else
               f": even n = {best['first_failing_n']} does not fit.")
        )
    findings.append(
        f"Time is the median of {cfg.repeats} runs of one call ({'all' if cfg.blas_threads is None else cfg.blas_threads} "
        f"BLAS thread(s), {DTYPE} inputs); peak memory is {MEMORY_SAYS} above what was allocated before it: the "
        "buffers the algorithm itself needs, counted to the byte; the inputs, and BLAS's or the interpreter's own "
        "memory, are not in it.")
    tables = (
        table("Table 1 of Vaswani et al. (2017)", ["layer", "compute per layer", "sequential steps", "path length"], TABLE_1),
        table(
            f"Operations per layer at d = {d}",
            ["n", "attention n²·d", "recurrent n·d²", "attention / recurrent", "sequential steps (attention / recurrent)"],
            [[c["n"], big(c["attention"]), big(c["recurrent"]), num(c["attention"] / c["recurrent"]), f"1 / {c['n']}"]
             for c in counts],
        ),
        *(_measured_table(name, p, cfg) for name, p in paths.items()),
    )
    data = {
        "config": asdict(cfg),
        "table_1": [dict(zip(("layer", "compute", "sequential", "path"), row)) for row in TABLE_1],
        "counts": {"d": d, "rows": counts},
        "paths": paths,
    }
    return Section("cost", 6, "Cost", tuple(findings), tables, data)
