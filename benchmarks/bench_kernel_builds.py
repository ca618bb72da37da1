"""The compiled kernel's forward (and forward + backward) before and after a change, side by side in one process.

    .venv/bin/python benchmarks/bench_kernel_builds.py --before REF [--sizes 4096,8192] [--heads 1,12]
        [--backward 4096] [--repeats 5] [--cpu] [--json benchmarks/results/kernel_builds.json]

``--before``: a git ref whose kernel sources are compiled here (``bench_decode_builds.build``); ``after`` is
the build attnlab imports. Both run the instruction set ``ATTNLAB_KERNEL_ISA`` names (else the best here),
on the same inputs (float32, batch 1, D = 64, not causal), interleaved with SDPA and ``gemm`` (the bench's
method: the attention's two GEMMs as torch calls on the loop's tiles, ``attnlab.bench.methods``) by
``attnlab.bench.timing.interleaved``: medians of wall time with the default threads. ``--cpu``: one thread
(torch's and the kernel's), each call's CPU time (``time.thread_time``), steadier on a loaded machine.
Printed per size: ms of each, GFLOP/s (4 n² D per head), % of gemm, × SDPA, and after / before.
``--backward N``: also forward + backward (dq, dk, dv) at n = N, 1 head, against SDPA's (``0``: none).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.backends import kernel
from attnlab.bench.methods import flops, inputs, runner
from attnlab.bench.timing import interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script from anywhere: the decode comparison sits here

from bench_decode_builds import build, load

SCALE = 64 ** -0.5


def _forward(mod: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, threads: int) -> Callable[[], Any]:
    out, lse = np.empty_like(q), np.empty(q.shape[:-1], np.float32)
    return lambda: mod.forward(q, k, v, out, lse, SCALE, *kernel.BLOCK, threads)


def _training(mod: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, threads: int) -> Callable[[], Any]:
    out, lse = np.empty_like(q), np.empty(q.shape[:-1], np.float32)
    dout = np.random.default_rng(1).standard_normal(q.shape, dtype=np.float32)
    grads = np.empty_like(q), np.empty_like(k), np.empty_like(v)

    def call() -> None:
        mod.forward(q, k, v, out, lse, SCALE, *kernel.BLOCK, threads)
        mod.backward(q, k, v, out, lse, dout, None, *grads, SCALE, *kernel.BACKWARD_BLOCK, threads)

    return call


def _sdpa_training(data: dict[str, Any]) -> Callable[[], Any]:
    q, k, v = (torch.from_numpy(x[None].copy()).requires_grad_() for x in data["np"])
    dout = torch.from_numpy(np.random.default_rng(1).standard_normal(q.shape, dtype=np.float32))

    def call() -> None:
        for t in (q, k, v):
            t.grad = None
        with torch.enable_grad():
            torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(dout)

    return call


def _cpu_times(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """One thread: each call's CPU time, every key once per round in a new order."""
    times: dict[str, list[float]] = {key: [] for key in calls}
    for fn in calls.values():
        fn()
    rng = np.random.default_rng(0)
    for _ in range(repeats):
        for i in rng.permutation(len(calls)):
            key = list(calls)[i]
            t0 = time.thread_time()
            calls[key]()
            times[key].append(time.thread_time() - t0)
    return times


def _measure(calls: dict[str, Callable[[], Any]], repeats: int, cpu: bool) -> dict[str, float]:
    times = _cpu_times(calls, repeats) if cpu else interleaved(calls, lambda key, out: None, repeats)[0]
    return {key: statistics.median(t) for key, t in times.items()}


def _row(label: str, work: float, med: dict[str, float]) -> dict[str, Any]:
    row = {"row": label, "ms": {key: t * 1e3 for key, t in med.items()}}
    row["after_over_before"] = med["after"] / med["before"]
    for key in ("before", "after"):
        row[f"{key}_over_sdpa"] = med[key] / med["sdpa"]
        if "gemm" in med:
            row[f"{key}_pct_of_gemm"] = 100 * med["gemm"] / med[key]
            row[f"{key}_gflops"] = work / med[key] / 1e9
    return row


def _print(row: dict[str, Any]) -> None:
    ms = "  ".join(f"{key} {t:.1f} ms" for key, t in row["ms"].items())
    pct = (f"  % of gemm {row['before_pct_of_gemm']:.0f} -> {row['after_pct_of_gemm']:.0f}"
           if "after_pct_of_gemm" in row else "")
    print(f"{row['row']}: {ms}{pct}  x SDPA {row['before_over_sdpa']:.2f} -> {row['after_over_sdpa']:.2f}"
          f"  after/before {row['after_over_before']:.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git ref of the kernel to compare with")
    ap.add_argument("--sizes", default="4096,8192", help="context lengths n of the forward rows")
    ap.add_argument("--heads", default="1,12", help="head counts of the forward rows")
    ap.add_argument("--backward", type=int, default=4096, help="n of the forward + backward row, 1 head (0: none)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds (medians reported)")
    ap.add_argument("--cpu", action="store_true", help="one thread, CPU time of each call")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    threads = 1 if args.cpu else 0
    if args.cpu:
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        before = load(str(build(args.before, Path(tmp))))
    after = kernel._tiles
    if os.environ.get(kernel.ENV_ISA):
        before.isa(after.isa())
    print(f"kernel ISA {after.isa()}; before {args.before}; {'1 thread, CPU time' if args.cpu else 'wall time'}; "
          f"torch threads {torch.get_num_threads()}; load average {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for heads in (int(h) for h in args.heads.split(",")):
        for n in (int(s) for s in args.sizes.split(",")):
            data = inputs(n, 64, heads, 0)
            q, k, v = data["np"]
            calls = {"before": _forward(before, q[:, None], k, v, threads), "after": _forward(after, q[:, None], k, v, threads),
                     "sdpa": runner("sdpa", data, False)[0], "gemm": runner("gemm", data, False)[0]}
            rows.append(_row(f"forward n={n} heads={heads}", flops(n, 64, heads, False), _measure(calls, args.repeats, args.cpu)))
            _print(rows[-1])
    if args.backward:
        data = inputs(args.backward, 64, 1, 0)
        q, k, v = data["np"]
        calls = {"before": _training(before, q[:, None], k, v, threads), "after": _training(after, q[:, None], k, v, threads),
                 "sdpa": _sdpa_training(data)}
        rows.append(_row(f"forward+backward n={args.backward} heads=1", 0.0, _measure(calls, args.repeats, args.cpu)))
        _print(rows[-1])
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"isa": after.isa(), "before": args.before, "cpu": args.cpu, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
