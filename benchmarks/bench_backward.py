"""Attention forward + backward (training speed) on the CPU: torch eager, SDPA, kernel, blockwise.

    .venv/bin/python benchmarks/bench_backward.py                                  # the table of benchmarks/README.md
    .venv/bin/python benchmarks/bench_backward.py --sizes 1024 --heads 1 --repeats 2   # a quick look
    .venv/bin/python benchmarks/bench_backward.py --sizes none --memory-n 65536         # only the memory probe
    .venv/bin/python benchmarks/bench_backward.py --cpu --memory-n 0                    # one thread, CPU seconds

Each timed call is one forward and one backward with gradients of q, k and v (float32, batch 1,
d = 64, a fixed random dout), from leaf tensors whose .grad is cleared first. Methods: ``eager``
is PyTorch's math (softmax(q kᵀ·scale) v, the (n, n) scores materialised), ``sdpa``
``torch.nn.functional.scaled_dot_product_attention``, ``kernel`` and ``blockwise`` attnlab's
backends (the compiled forward + backward; the Python loop of torch calls). Every method once per
round, in a new seeded order each round, the median of the rounds (attnlab.bench.timing's loop:
a call under 50 ms is timed over several in a row). ``grad err`` is the largest difference of a
method's gradients from SDPA's, relative to SDPA's largest. Peak extra memory: the rise of the
process's peak resident set during one forward + backward (inputs and dout made before; the
output and the three gradients count).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

import torch

from attnlab.backends import kernel
from attnlab.backends.api import attention
from attnlab.bench.timing import interleaved, probe

METHODS = ("eager", "sdpa", "kernel", "blockwise")


def _eager(q: Any, k: Any, v: Any, causal: bool) -> Any:
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(m - n), -math.inf)
    return torch.softmax(s, dim=-1) @ v


def _function(method: str, causal: bool) -> Any:
    if method == "eager":
        return lambda q, k, v: _eager(q, k, v, causal)
    if method == "sdpa":
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return lambda q, k, v: attention(q, k, v, causal=causal, backend=method)


def _step(method: str, causal: bool, leaves: tuple, dout: Any) -> Any:
    f = _function(method, causal)

    def call() -> Any:
        with torch.enable_grad():  # the timing loop runs under no_grad
            for x in leaves:
                x.grad = None
            out = f(*leaves)
            out.backward(dout)
        return tuple(x.grad for x in leaves)

    return call


def _inputs(n: int, heads: int, d: int, seed: int = 0) -> tuple[tuple, Any]:
    g = torch.Generator().manual_seed(seed)
    leaves = tuple(torch.randn(1, heads, n, d, generator=g).requires_grad_() for _ in range(3))
    return leaves, torch.randn(1, heads, n, d, generator=g)


def _eager_bytes(n: int, heads: int) -> float:
    return 4.0 * 5 * heads * n * n  # scores, weights and their gradients, float32


def run(sizes: list[int], heads_list: list[int], d: int, repeats: int, memory_mb: float, max_seconds: float) -> list[dict]:
    rows: list[dict] = []
    last: dict[tuple, float] = {}
    for heads in heads_list:
        for n in sizes:
            for causal in (False, True):
                leaves, dout = _inputs(n, heads, d)
                calls, skipped = {}, {}
                for m in METHODS:
                    prev = last.get((m, heads, causal))
                    if m == "eager" and _eager_bytes(n, heads) > memory_mb * 2**20:
                        skipped[m] = "memory"
                    elif prev is not None and prev[1] * (n / prev[0]) ** 2 > max_seconds:
                        skipped[m] = "time"
                    else:
                        calls[m] = _step(m, causal, leaves, dout)
                grads: dict[str, tuple] = {}

                def error(key: str, out: tuple) -> None:
                    grads[key] = tuple(g.clone() for g in out)

                times, peaks, _ = interleaved(calls, error, repeats, probe=probe)
                ref = grads.get("sdpa")
                for m in METHODS:
                    row = {"n": n, "heads": heads, "causal": causal, "method": m, "skipped": skipped.get(m)}
                    if m in times:
                        med = statistics.median(times[m])
                        last[(m, heads, causal)] = (n, med)
                        err = None
                        if ref is not None:
                            err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(grads[m], ref))
                        row.update(ms=1e3 * med, times_ms=[1e3 * t for t in times[m]], peak_mb=(peaks[m] or 0) / 2**20,
                                   grad_err=err)
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "times_ms"}), file=sys.stderr)
    return rows


def cpu_seconds(sizes: list[int], heads_list: list[int], d: int, repeats: int) -> list[dict]:
    """One thread (torch.set_num_threads(1)): the least CPU time of the calling thread over the rounds, sdpa and
    kernel interleaved. On a loaded machine wall times measure the scheduler; a thread's CPU time much less so."""
    import time

    torch.set_num_threads(1)
    rows = []
    for heads in heads_list:
        for n in sizes:
            for causal in (False, True):
                leaves, dout = _inputs(n, heads, d)
                calls = {m: _step(m, causal, leaves, dout) for m in ("sdpa", "kernel")}
                best = {m: math.inf for m in calls}
                for f in calls.values():
                    f()
                for _ in range(repeats):
                    for m, f in calls.items():
                        t0 = time.thread_time()
                        f()
                        best[m] = min(best[m], time.thread_time() - t0)
                for m in calls:
                    rows.append({"n": n, "heads": heads, "causal": causal, "method": m, "ms": 1e3 * best[m]})
                    print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def memory(n: int, d: int, methods: tuple[str, ...] = ("kernel", "sdpa")) -> list[dict]:
    """Peak extra memory of one forward + backward at n (1 head) for each method."""
    rows = []
    for method in methods:
        for causal in (False, True):
            leaves, dout = _inputs(n, 1, d)
            call = _step(method, causal, leaves, dout)
            _, seconds, peak = probe(call)
            grads_mb = 3 * n * d * 4 / 2**20
            rows.append({"n": n, "heads": 1, "causal": causal, "method": method, "seconds": seconds,
                         "peak_mb": (peak or 0) / 2**20, "gradients_mb": grads_mb})
            print(json.dumps(rows[-1]), file=sys.stderr)
            del leaves, dout, call
    return rows


def table(rows: list[dict]) -> str:
    """The Markdown table: ms per method, kernel ÷ sdpa, and the kernel's causal time ÷ its full time."""
    by = {(r["n"], r["heads"], r["causal"], r["method"]): r for r in rows}
    keys = sorted({(r["n"], r["heads"], r["causal"]) for r in rows}, key=lambda x: (x[1], x[0], x[2]))
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    out = ["| n | heads | mask | " + " | ".join(f"{m} ms" for m in methods) + " | kernel ÷ sdpa | kernel causal ÷ full |",
           "|---:|---:|---|" + "---:|" * (len(methods) + 2)]
    for n, h, c in keys:
        cells = []
        for m in methods:
            r = by.get((n, h, c, m))
            cells.append(f"{r['ms']:.1f}" if r and "ms" in r else f"({r['skipped']})" if r else "")
        k, s = by.get((n, h, c, "kernel")), by.get((n, h, c, "sdpa"))
        ratio = f"{k['ms'] / s['ms']:.2f}" if k and s and "ms" in k and "ms" in s else ""
        full = by.get((n, h, False, "kernel"))
        own = f"{k['ms'] / full['ms']:.2f}" if c and k and full and "ms" in k and "ms" in full else ""
        out.append(f"| {n} | {h} | {'causal' if c else 'full'} | " + " | ".join(cells) + f" | {ratio} | {own} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048,4096,8192", help="n, comma-separated ('none': no timing)")
    p.add_argument("--heads", default="1,12")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="rounds (median)")
    p.add_argument("--memory-mb", type=float, default=4096.0, help="skip eager above this estimate")
    p.add_argument("--max-seconds", type=float, default=20.0, help="skip a method whose n² extrapolation passes this")
    p.add_argument("--memory-n", type=int, default=65536, help="n of the peak-memory probe (0: none)")
    p.add_argument("--memory-methods", default="kernel,sdpa", help="methods of the peak-memory probe")
    p.add_argument("--cpu", action="store_true", help="one thread, CPU seconds of sdpa and kernel (see cpu_seconds)")
    p.add_argument("--json", default=None, help="write every measurement here")
    a = p.parse_args(argv)
    sizes = [] if a.sizes == "none" else [int(x) for x in a.sizes.split(",")]
    info = {"cpu_isa": kernel.isa(), "build": kernel.build_info(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "d": a.d}
    print(json.dumps(info), file=sys.stderr)
    heads = [int(x) for x in a.heads.split(",")]
    if a.cpu:
        rows = cpu_seconds(sizes, heads, a.d, a.repeats)
    else:
        rows = run(sizes, heads, a.d, a.repeats, a.memory_mb, a.max_seconds) if sizes else []
    mem = memory(a.memory_n, a.d, tuple(a.memory_methods.split(","))) if a.memory_n else []
    if rows:
        print(table(rows))
    for r in mem:
        print(f"peak extra memory, n = {r['n']}, 1 head, {'causal' if r['causal'] else 'full'}, {r['method']}: "
              f"{r['peak_mb']:.0f} MB (of which gradients {r['gradients_mb']:.0f} MB)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": info, "rows": rows, "memory": mem}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
