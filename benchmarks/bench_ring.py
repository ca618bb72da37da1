"""Ring attention across processes: time and peak memory per rank against one process.

    torchrun --nproc-per-node 4 benchmarks/bench_ring.py --seq-len 131072 --json benchmarks/results/ring_p4.json
    torchrun --nproc-per-node 2 benchmarks/bench_ring.py --seq-len 131072 --json benchmarks/results/ring_p2.json
    .venv/bin/python benchmarks/bench_ring.py --seq-len 131072 --json benchmarks/results/ring_p1.json   # one process
    .venv/bin/python benchmarks/bench_ring.py --table benchmarks/results/ring_p*.json

Each case (full, or causal in a layout) is one forward call (with ``--backward``: forward and
backward) of
:func:`attnlab.distributed.ring_attention` (float32, batch 1, one head, d = 64; the compiled
kernel computes each block) on every rank at once, after a barrier; the job's time is the slowest
rank's. Without torchrun the same call runs as one process (world size 1: plain attention through
the same code), and ``--single`` adds ``attnlab.attention(backend="kernel")``, the call one process
would make. Memory per rank: the shards it holds (q, k, v) plus the rise of its peak resident set
during the call (``/proc/self/clear_refs`` resets the peak; freed heap goes back first, as in
``attnlab.bench``). Communication: a rank sends its k/v block on at each of the p − 1 steps,
``n/p · (d + dv) · 4`` bytes; the script times those p − 1 exchanges alone, without compute,
and one step's compute alone (a full n/p × n/p block), so the two can be set side by side.
A small call first warms the connections and thread pools. Only rank 0 prints and writes.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def probe(fn):  # noqa: ANN001, ANN201
    """(result, seconds, peak extra resident bytes, CPU seconds of the process's threads) of one call."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts again from the current one
    before = status_kb("VmRSS")
    c0, t0 = time.process_time(), time.perf_counter()
    res = fn()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return res, dt, max(0, status_kb("VmHWM") - before) * 1024, cpu


def shards(n: int, d: int, heads: int, rank: int, world: int, layout: str, seed: int = 0):  # noqa: ANN201
    """This rank's q, k, v (1, heads, n/p, d) of one seeded whole sequence, without keeping the whole."""
    import torch

    from attnlab.distributed import shard

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(3):
        whole = torch.randn(1, heads, n, d, generator=g)
        out.append(shard(whole, rank, world, layout).contiguous())
        del whole
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return out


def comm_alone(k, v, world: int, rank: int) -> float:  # noqa: ANN001
    """Seconds for the p − 1 ring exchanges of a k/v block, without compute (the slowest rank's)."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return 0.0
    dist.barrier()
    t0 = time.perf_counter()
    kb, vb = k, v
    for _ in range(world - 1):
        recv = [torch.empty_like(kb), torch.empty_like(vb)]
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % world) for x in (kb, vb)]
        ops += [dist.P2POp(dist.irecv, x, (rank - 1) % world) for x in recv]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        kb, vb = recv
    return time.perf_counter() - t0


def step_compute(q, k, v) -> float:  # noqa: ANN001
    """Seconds for one full block of this rank's queries against a block of n/p keys (one ring step's work)."""
    from attnlab.backends import kernel
    from attnlab.backends.tiling import Tiling

    q4, k3, v3 = q.reshape(-1, 1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:])
    t0 = time.perf_counter()
    kernel.forward(q4, k3, v3, Tiling(q4.shape[2], k3.shape[1]), scale=q.shape[-1] ** -0.5)
    return time.perf_counter() - t0


def run_case(name: str, causal: bool, layout: str, args, rank: int, world: int) -> dict:  # noqa: ANN001
    import torch
    import torch.distributed as dist

    from attnlab.distributed import ring_attention
    from attnlab.distributed.layout import plan_block, positions, shard_lengths

    q, k, v = shards(args.n, args.d, args.heads, rank, world, layout)
    if args.backward:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
    if world > 1:
        dist.barrier()

    def call():  # noqa: ANN202
        out = ring_attention(q, k, v, causal=causal, layout=layout, backend="kernel")
        if args.backward:
            out.backward(torch.ones_like(out))  # the gradients of out.sum()
        return out.detach()

    for _ in range(args.rounds):  # the last round counts: the first pays for the allocator's growth
        out, seconds, extra, cpu = probe(call)
        if args.backward:
            for x in (q, k, v):
                x.grad = None
        if world > 1:
            dist.barrier()
    rows = shard_lengths(args.n, world, layout)
    pos = positions(rows, layout)
    scores = [sum(r.scores for r in plan_block(pos[rank], pos[(rank - t) % world], causal)) for t in range(world)]
    row = {
        "case": name, "rank": rank, "world": world, "n": args.n, "d": args.d, "heads": args.heads,
        "causal": causal, "layout": layout, "backward": args.backward, "time_s": seconds, "cpu_s": cpu, "extra_bytes": extra,
        "input_bytes": sum(x.numel() * x.element_size() for x in (q, k, v)), "output_bytes": out.numel() * out.element_size(),
        "peak_rss_bytes": status_kb("VmHWM") * 1024, "scores_per_step": scores,
        "bytes_sent_per_step": (k.numel() + v.numel()) * k.element_size(),
        "steps": world,
    }
    del out
    if args.comm and world > 1 and name == args.cases.split(",")[0]:
        row["comm_alone_s"] = comm_alone(k, v, world, rank)
        row["step_compute_s"] = step_compute(q, k, v)
    if args.single and world == 1:
        import attnlab

        def single():  # noqa: ANN202
            out = attnlab.attention(q, k, v, causal=causal, backend="kernel")
            if args.backward:
                out.backward(torch.ones_like(out))
            return out.detach()

        for _ in range(args.rounds):
            _, s_seconds, s_extra, s_cpu = probe(single)
            for x in (q, k, v):
                x.grad = None
        row.update(single_time_s=s_seconds, single_extra_bytes=s_extra, single_cpu_s=s_cpu)
    return row


CASES = {"full": (False, "contiguous"), "causal-contiguous": (True, "contiguous"), "causal-zigzag": (True, "zigzag")}


def table(paths: list[str]) -> str:
    """A Markdown table from result files: per case and p, the slowest rank's time and the largest rank's memory."""
    rows = []
    for p in paths:
        rows += json.loads(Path(p).read_text())["ranks"]
    lines = ["| case | p | time (s), slowest rank | CPU (s), all ranks | per rank: inputs + extra during the call (MB), largest | "
             "k/v sent per step (MB) | exchanges alone (s) | one step's compute alone (s) |", "|---|---|---|---|---|---|---|---|"]
    for case, grad in [(c, g) for g in (False, True) for c in CASES]:
        for world in sorted({r["world"] for r in rows}):
            rs = [r for r in rows if r["case"] == case and r["world"] == world and r.get("backward", False) == grad]
            if not rs:
                continue
            label = case + (" (fwd + bwd)" if grad else "")
            mem = max(r["input_bytes"] + r["extra_bytes"] for r in rs) / 1e6
            comm = max((r["comm_alone_s"] for r in rs if "comm_alone_s" in r), default=None)
            step = max((r["step_compute_s"] for r in rs if "step_compute_s" in r), default=None)
            sent = max(r["bytes_sent_per_step"] for r in rs) / 1e6 if world > 1 else 0.0
            cpu = sum(r["cpu_s"] for r in rs)
            lines.append(f"| {label} | {world} | {max(r['time_s'] for r in rs):.1f} | {cpu:.1f} | {mem:.0f} | {sent:.1f} | "
                         f"{'–' if comm is None else f'{comm:.3f}'} | {'–' if step is None else f'{step:.2f}'} |")
            for r in rs:
                if "single_time_s" in r:
                    lines.append(f"| {label}: attnlab.attention | 1 | {r['single_time_s']:.1f} | {r['single_cpu_s']:.1f} | "
                                 f"{(r['input_bytes'] + r['single_extra_bytes']) / 1e6:.0f} | – | – | – |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", dest="n", type=int, default=131072, help="n, the whole sequence")
    ap.add_argument("--head-dim", dest="d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--cases", default="full,causal-contiguous,causal-zigzag", help=f"comma-separated: {', '.join(CASES)}")
    ap.add_argument("--rounds", type=int, default=1, help="calls per case; the last one is reported")
    ap.add_argument("--backward", action="store_true", help="time forward and backward (of out.sum()) together")
    ap.add_argument("--single", action="store_true", help="one process: also time attnlab.attention(backend='kernel')")
    ap.add_argument("--no-comm", dest="comm", action="store_false", help="skip timing the exchanges and one step alone")
    ap.add_argument("--json", help="write every rank's measurements here (rank 0)")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of these result files and stop")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    import torch

    from attnlab.backends import kernel
    from attnlab.distributed import env

    joined = env.init_from_env(timeout_s=1800, backend="gloo")
    rank, world = env.rank_and_world()
    if world == 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
    from attnlab.distributed import ring_attention

    warm = torch.randn(1, args.heads, 64, args.d, requires_grad=True)  # connections, thread pools, lazy imports
    ring_attention(warm, warm, warm, causal=True, backend="kernel").sum().backward()
    ranks = []
    for name in args.cases.split(","):
        causal, layout = CASES[name]
        row = run_case(name, causal, layout, args, rank, world)
        if world > 1:
            gathered = [None] * world
            torch.distributed.all_gather_object(gathered, row)
        else:
            gathered = [row]
        ranks += gathered
        if rank == 0:
            slow = max(r["time_s"] for r in gathered)
            mem = max(r["input_bytes"] + r["extra_bytes"] for r in gathered) / 1e6
            print(f"{name:18s} p={world} n={args.n}: {slow:7.2f} s (slowest rank), {mem:7.1f} MB per rank (largest)"
                  + (f"; one process attnlab.attention: {row['single_time_s']:.2f} s, "
                     f"{(row['input_bytes'] + row['single_extra_bytes']) / 1e6:.1f} MB" if "single_time_s" in row else ""),
                  flush=True)
    if rank == 0 and args.json:
        machine = {"cpu": platform.processor(), "cores": os.cpu_count(), "isa": kernel.isa(), "torch": torch.__version__,
                   "threads_per_rank": torch.get_num_threads(), "load_average": os.getloadavg(), "python": sys.version.split()[0],
                   "numpy": np.__version__}
        try:
            with open("/proc/cpuinfo") as f:
                machine["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        Path(args.json).write_text(json.dumps({"args": vars(args), "machine": machine, "ranks": ranks}, indent=1) + "\n")
    if joined:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
