"""One decode step over a quantized KV cache against float32 and bfloat16: time, stored GB/s, GFLOP/s.

    .venv/bin/python benchmarks/bench_kvcache.py [--length 32768] [--repeats 7] [--threads 2]
        [--json benchmarks/results/kvcache.json]

The decode benchmark's shape (benchmarks/bench_decode.py): B = 1, 32 query heads over 8 k/v heads, D = 128, one
query row at the end of a cache of ``--length`` positions, ``attnlab.attention(q, k, v, causal=True)`` as a step
of ``Transformer.generate`` calls it. Caches: float32 and bfloat16 tensors (auto's backend, and blockwise with the
quantized reads' key blocks for a like-for-like row: what the dequantization itself costs), and int8, fp8, int4
(:class:`attnlab.reference.quantized.QuantizedKV`) by each backend that reads codes, named: the compiled kernel's
decode pass (codes dequantized in registers, int4's residual in the same pass), blockwise and torch (a block of keys
dequantized at a time); the printout says which auto takes. The rounds are
interleaved (every cache once per round), the median is reported. Per cache: the bytes it stores (codes, scales,
zero points, residual), GB/s of them, GFLOP/s (4·H·Tk·D per step: q·k and p·v), and the time as a multiple of the
float32 step's (auto); then the same read as ``generate`` makes it, through its ``attnlab.backends.reads.Reads``
(the backend's decode pass called directly once chosen; a float cache's keys checked when written), timed in the
same rounds after every cache's ``attention()`` call (none read twice in a row), as a multiple of float32's read
the same way. ``--quick``: 2,048 positions, 2 rounds (a smoke run;
its figures mean nothing).
Beside them, measured in the same run, the machine's two limits: its read bandwidth (a STREAM-like sum of a
buffer 8 times the last-level cache, :func:`attnlab.bench.decode.read_bandwidth`) and its float32 multiply-add
rate (sgemm: torch.mm of two 2,048 x 2,048 matrices, the same threads), medians of 7 as the steps' are medians.
Each cache's step is printed as a share of both (``% bw``: its stored bytes at the read bandwidth; ``% mm``: its
q.k and p.v multiply-adds at sgemm's rate) and ``binds`` names the nearer: a step at 90 % of one limit cannot get
much faster by the other. A quantized step's dequantization and every step's softmax are work beyond the
multiply-adds counted, so ``% mm`` stays below 100.
``--bound``: also the compiled pass's CPU time per (position, k/v head) on one thread (``time.process_time``, so
other programs' share of the core is not counted) at ``--length`` and at 2,048 positions (every cache then fits in
the last-level cache): a kind whose cost per position is the same in and out of cache is bound by its arithmetic
(dequantizing and multiplying), not by memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

H, HKV, D = 32, 8, 128


def caches(length: int) -> dict:
    """name -> (k, v, backend, bytes stored) for every cache measured, filled with the same random entries."""
    import torch

    from attnlab.transformer.layer_cache import Step
    from attnlab.transformer.quantize import Store

    from attnlab.bench.decode import cache_like

    g = torch.Generator().manual_seed(0)  # every cache as the model's holds it (Store's codes too: on huge pages)
    k, v = (cache_like(torch.randn(1, HKV, length, D, generator=g), torch.float32) for _ in "kv")
    out = {"float32": (k, v, "auto", k.nbytes + v.nbytes), "float32 blockwise": (k, v, "blockwise", k.nbytes + v.nbytes)}
    kb, vb = cache_like(k, torch.bfloat16), cache_like(v, torch.bfloat16)
    out["bfloat16"] = (kb, vb, "auto", kb.nbytes + vb.nbytes)
    step = Step(torch.zeros(1, dtype=torch.long), torch.tensor([length]), length)
    for kind in ("int8", "fp8", "int4"):
        ks = Store(kind, 1, HKV, D, length, torch.float32, "cpu", grouping="channel")
        vs = Store(kind, 1, HKV, D, length, torch.float32, "cpu", grouping="token")
        ks.write(step, k)
        vs.write(step, v)
        for backend in readers(kind):  # every backend that reads the kind (auto picks one; the table says which)
            out[f"{kind} {backend}"] = (ks.read(length), vs.read(length), backend, ks.nbytes + vs.nbytes)
    return out


def readers(kind: str) -> list[str]:
    """The backends that read a ``kind`` cache, the float64 reference left out."""
    from attnlab.backends.dispatch import BACKENDS

    return [name for name, b in BACKENDS.items() if name != "numpy" and "quantized" in b.supports.features
            and kind in b.quantized_kinds]


def measure(length: int, repeats: int) -> list[dict]:
    import torch

    import attnlab
    from attnlab.backends.blockwise import QUANTIZED_DECODE_KEYS
    from attnlab.backends.dispatch import choose
    from attnlab.backends.reads import Reads
    from attnlab.backends.request import prepare

    q = torch.randn(1, H, 1, D, generator=torch.Generator().manual_seed(1))
    cs = caches(length)
    blocks = {"float32 blockwise": (1, QUANTIZED_DECODE_KEYS)}  # like for like: the key blocks of the quantized reads
    times: dict[str, list[float]] = {n: [] for n in cs}
    reads = {n: (Reads(backend), _read_kwargs(k)) for n, (k, _, backend, _) in cs.items() if n not in blocks}
    steps: dict[str, list[float]] = {n: [] for n in reads}
    for _ in range(repeats + 1):  # the first round warms up (imports, auto's choice), not counted
        for name, (k, v, backend, _) in cs.items():
            t0 = time.perf_counter()
            attnlab.attention(q, k, v, causal=True, backend=backend, block_size=blocks.get(name))
            times[name].append(time.perf_counter() - t0)
        for name, (read, kw) in reads.items():  # generate()'s read (its Reads: the decode pass called directly),
            k, v = cs[name][:2]  # after every other cache's call: none is still in the last-level cache
            t0 = time.perf_counter()
            read(0, q, k, v, kw)
            steps[name].append(time.perf_counter() - t0)
    base, step_base = statistics.median(times["float32"][1:]), statistics.median(steps["float32"][1:])
    flops = 4.0 * H * length * D
    rows = []
    for name, (k, v, backend, nbytes) in cs.items():
        t = statistics.median(times[name][1:])
        served = choose(prepare(q, k, v, attnlab.backends.options.Options(causal=True)).request, backend).name
        rows.append({"cache": name, "backend": served, "auto": choose(prepare(q, k, v).request).name, "ms": 1e3 * t, "x_float32": t / base, "stored_mb": nbytes / 1e6,
                     "stored_gb_s": nbytes / t / 1e9, "gflop_s": flops / t / 1e9,
                     "spread_ms": [1e3 * min(times[name][1:]), 1e3 * max(times[name][1:])]})
        if name in steps:
            ts = statistics.median(steps[name][1:])
            rows[-1].update({"generate_ms": 1e3 * ts, "generate_x_float32": ts / step_base,
                             "generate_stored_gb_s": nbytes / ts / 1e9})
    return rows


def _read_kwargs(k) -> dict:  # noqa: ANN001
    """The keywords of generate()'s read of a cache holding ``k`` (every key seen; a float cache's checked)."""
    from attnlab.bench.decode import _generate_kwargs
    from attnlab.reference.quantized import QuantizedKV

    return {"causal": True, "mask": None, "lengths": None} if isinstance(k, QuantizedKV) else _generate_kwargs(k)


def limits(threads: int, repeats: int = 7) -> dict:
    """The machine's read bandwidth (GB/s) and sgemm rate (float32 GFLOP/s) with ``threads`` threads, medians of
    ``repeats`` (as the steps': on a shared host the fastest of a few reads can be half again the usual one)."""
    from attnlab.bench.decode import llc_bytes, read_bandwidth
    from attnlab.bench.timing import torch_threads

    with torch_threads(threads):
        return {"read_gb_s": read_bandwidth(llc_bytes(), repeats, median=True),
                "sgemm_gflop_s": sgemm_rate(threads, repeats)}


def sgemm_rate(threads: int, repeats: int = 7) -> float:
    """float32 GFLOP/s of torch.mm on two 2,048 x 2,048 matrices with ``threads`` threads, the median of ``repeats``."""
    import torch

    from attnlab.bench.timing import torch_threads

    n = 2048
    with torch_threads(threads):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / statistics.median(times) / 1e9


def shares(rows: list[dict], lim: dict) -> None:
    """Each row's step as a share of the read bandwidth and of sgemm's rate, and which of the two binds."""
    for r in rows:
        r["pct_bandwidth"] = 100 * r["stored_gb_s"] / lim["read_gb_s"]
        r["pct_sgemm"] = 100 * r["gflop_s"] / lim["sgemm_gflop_s"]
        r["binds"] = "memory" if r["pct_bandwidth"] >= r["pct_sgemm"] else "arithmetic"


def bound(length: int) -> dict:
    """{cache: {positions: CPU ns per position and k/v head}} of the kernel's decode pass on one thread."""
    import torch

    from attnlab.backends import kernel

    q, out = torch.randn(1, H, 1, D, generator=torch.Generator().manual_seed(1)), {}
    for n in (2048, length):
        cs = caches(n)
        for name in ("float32", "bfloat16", "int8 kernel", "fp8 kernel", "int4 kernel"):
            k, v = cs[name][:2]
            calls, best = max(2, 65536 // n * 4), float("inf")
            for _ in range(4):  # the first round warms up
                c0 = time.process_time()
                for _ in range(calls):
                    kernel.decode(q, k, v, scale=D ** -0.5, threads=1)
                best = min(best, (time.process_time() - c0) / calls)
            out.setdefault(name.split()[0], {})[n] = 1e9 * best / (n * HKV)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=32768, help="cached positions (default 32768)")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds (median reported)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="2,048 positions, 2 rounds: a smoke run")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--bound", action="store_true", help="also the kernel's CPU ns per position on one thread, in and out of cache")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    length, repeats = (2048, 2) if args.quick else (args.length, args.repeats)
    rows = measure(length, repeats)
    lim = limits(torch.get_num_threads())
    shares(rows, lim)
    from attnlab.backends import kernel

    info = kernel.build_info() or {}  # which variant read the caches, and whether int4's keys went to AMX
    amx = bool(info.get("amx")) and info.get("chosen") == "AVX-512"  # only that variant's int4 decoding uses it
    isa = f"{info.get('chosen')}{' with AMX' if amx else ''}" if info else "kernel not built"
    print(f"decode step, B=1, H={H} over H_kv={HKV}, D={D}, {length} cached positions, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}, {isa}")
    print(f"limits measured in this run: read bandwidth {lim['read_gb_s']:.1f} GB/s, sgemm {lim['sgemm_gflop_s']:.0f} GFLOP/s")
    print(f"{'cache':<18}{'backend':<11}{'auto':<11}{'ms':>9}{'x f32':>8}{'MB':>9}{'GB/s':>8}{'GFLOP/s':>9}"
          f"{'% bw':>6}{'% mm':>6}  {'binds':<11}{'generate ms':>12}{'x f32':>8}")
    for r in rows:
        step = f"{r['generate_ms']:>12.2f}{r['generate_x_float32']:>8.2f}" if "generate_ms" in r else ""
        print(f"{r['cache']:<18}{r['backend']:<11}{r['auto']:<11}{r['ms']:>9.2f}{r['x_float32']:>8.2f}{r['stored_mb']:>9.1f}"
              f"{r['stored_gb_s']:>8.2f}{r['gflop_s']:>9.2f}{r['pct_bandwidth']:>6.0f}{r['pct_sgemm']:>6.0f}  {r['binds']:<11}{step}")
    cpu = bound(length) if args.bound else None
    if cpu:
        lim["sgemm_one_thread_gflop_s"] = sgemm_rate(1)  # the bandwidth is not needed again
        floor = 4.0 * H // HKV * D / lim["sgemm_one_thread_gflop_s"]  # ns: a position's multiply-adds for G rows
        print(f"one thread's sgemm {lim['sgemm_one_thread_gflop_s']:.0f} GFLOP/s: a position and k/v head's multiply-adds "
              f"(4 G D = {4 * H // HKV * D} flops) alone take {floor:.1f} ns at that rate")
        lim["multiply_adds_ns_per_position"] = floor
    for name, by_n in (cpu or {}).items():
        print(f"kernel {name:<9} CPU ns per position and k/v head, one thread: " +
              ", ".join(f"{n} positions {ns:.1f}" for n, ns in by_n.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"length": length, "heads": H, "heads_kv": HKV, "head_dim": D, "threads": torch.get_num_threads(),
                       "load_average": os.getloadavg()[0], "repeats": repeats, "isa": info.get("chosen"),
                       "amx": amx, "limits": lim, "rows": rows, "cpu_ns_per_position": cpu},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
