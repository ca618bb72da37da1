"""The compiled decode pass before and after a change: two builds of the kernel side by side in one process.

    .venv/bin/python benchmarks/bench_decode_builds.py [--before main] [--lengths 16384,32768,65536]
        [--dtypes float32,bfloat16] [--repeats 7] [--json benchmarks/results/decode_builds.json]

``--before``: a git ref of this repository; its kernel sources (src/attnlab/backends/kernel/*.c, *.h) are
compiled here with the flags of pyproject.toml into a temporary folder. ``after`` is the build attnlab
imports. Both are loaded at once (the extension's file, twice) and called interleaved, round by round, on
the same caches (B = 1, 32 query heads over 8 k/v heads, D = 128, one query row: ``attnlab bench --decode``'s
shape), rotated so that their total is at least twice the last-level cache (every step reads memory).
Per build, dtype and length: the median wall time of a step with the default threads, its GB/s of keys and
values as stored and that as % of the read bandwidth (:func:`attnlab.bench.decode.read_bandwidth`, measured
in the same run), and the median CPU time of a step on one thread (``time.thread_time``: what the pass
itself costs, steadier than wall time on a loaded machine). The same bits from both builds are not required
(the summation order may change); their largest difference is printed. ``--dtypes`` may also name the quantized
caches ``int8``, ``fp8`` and ``int4`` (:class:`attnlab.reference.quantized.QuantizedKV`, written by the model's
cache from the same random entries): those go through ``kernel.decode`` with each build swapped in (its Python
checks, tens of microseconds, in both), their bytes are the codes, scales, zero points and residual stored.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "src/attnlab/backends/kernel"
QUANTIZED = ("int8", "fp8", "int4")
FLAGS = ["-shared", "-fPIC", "-O3", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno", "-std=gnu11"]


def build(ref: str, into: Path) -> Path:
    """The kernel of git ref ``ref`` compiled into ``into``: the .so's path."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{ref}:{KERNEL}"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith((".c", ".h")):
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{KERNEL}/{name}"], check=True,
                                  capture_output=True).stdout
            (into / name).write_bytes(text)
    out = into / "_tiles_before.so"
    cc = os.environ.get("CC", "gcc")
    subprocess.run([cc, *FLAGS, f"-I{sysconfig.get_paths()['include']}", str(into / "_tiles.c"), "-o", str(out)], check=True)
    return out


def load(path: str) -> object:
    spec = importlib.util.spec_from_file_location("_tiles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stored(dtype: str, k, v) -> tuple:
    """float32 k and v (1, 8, n, 128) as a ``dtype`` cache holds them: (k, v, bytes stored)."""
    import torch

    from attnlab.bench.decode import cache_like

    if dtype not in QUANTIZED:
        k, v = (cache_like(x, getattr(torch, dtype)) for x in (k, v))  # as the model's cache holds them
        return *((x.view(torch.int16) if dtype == "bfloat16" else x).numpy() for x in (k, v)), k.nbytes + v.nbytes
    from attnlab.transformer.layer_cache import Step
    from attnlab.transformer.quantize import Store

    n, out = k.shape[2], []
    written = Step(torch.zeros(1, dtype=torch.long), torch.tensor([n]), n)
    for x, grouping in ((k, "channel"), (v, "token")):  # the model's cache: keys per channel, values per token
        store = Store(dtype, 1, 8, 128, n, torch.float32, "cpu", grouping=grouping)
        store.write(written, x)
        out.append((store.read(n), store.nbytes))
    return out[0][0], out[1][0], out[0][1] + out[1][1]


def caches(dtype: str, n: int, llc: int) -> tuple[list[tuple], int]:
    """Enough (q, k, v) sets that their total is at least twice the last-level cache, and one set's bytes."""
    import numpy as np
    import torch

    gen = torch.Generator().manual_seed(n)
    found, size = [], 0
    while not found or len(found) * size < 2 * llc:
        q = torch.randn(1, 32, 1, 128, generator=gen).numpy()
        k, v, size = stored(dtype, *(torch.randn(1, 8, n, 128, generator=gen) for _ in "kv"))
        found.append((np.ascontiguousarray(q), k, v))
    return found, size


def step(m, q, k, v, out, lse, dtype: str, threads: int) -> None:
    """One decode step by build m (quantized caches: through kernel.decode with m swapped in)."""
    if dtype not in QUANTIZED:
        m.decode(q, k, v, out, lse, dtype, 0.088, threads)
        return
    from attnlab.backends import kernel

    mine, kernel._tiles = kernel._tiles, m
    try:
        out[...] = kernel.decode(q, k, v, scale=0.088, threads=threads)[0]
    finally:
        kernel._tiles = mine


def measure(builds: dict, dtype: str, n: int, llc: int, repeats: int) -> dict:
    import numpy as np

    sets, size = caches(dtype, n, llc)
    out, lse = np.empty((1, 32, 1, 128), np.float32), np.empty((1, 32, 1), np.float32)
    first = {}
    for name, m in builds.items():
        step(m, *sets[0], out, lse, dtype, 0)
        first[name] = out.copy()
    wall = {name: [] for name in builds}
    cpu = {name: [] for name in builds}
    for _ in range(repeats):
        for name, m in builds.items():
            t0 = time.perf_counter()
            for q, k, v in sets:
                step(m, q, k, v, out, lse, dtype, 0)
            wall[name].append((time.perf_counter() - t0) / len(sets))
            t0 = time.thread_time()
            for q, k, v in sets:
                step(m, q, k, v, out, lse, dtype, 1)
            cpu[name].append((time.thread_time() - t0) / len(sets))
    values = list(first.values())
    return {"wall_s": {b: statistics.median(t) for b, t in wall.items()},
            "cpu_1thread_s": {b: statistics.median(t) for b, t in cpu.items()},
            "bytes": size, "caches": len(sets),
            "max_diff": float(np.abs(values[0] - values[-1]).max())}


def main(argv: list[str] | None = None) -> int:
    from attnlab.backends import kernel
    from attnlab.bench.decode import llc_bytes, read_bandwidth

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="main", help="git ref whose kernel is 'before' (default: main)")
    ap.add_argument("--lengths", default="16384,32768,65536", help="cache lengths, comma-separated")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="cache dtypes: float32, bfloat16, float16, int8, fp8, int4")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds (medians reported)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.dtypes.split(",")) - {"float32", "bfloat16", "float16", *QUANTIZED})
    if unknown:
        ap.error(f"--dtypes takes float32, bfloat16, float16, {', '.join(QUANTIZED)}; got {', '.join(unknown)}")
    if kernel._tiles is None:
        print("error: the compiled kernel was not built here", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"before": load(str(build(args.before, Path(tmp)))), "after": kernel._tiles}
        if kernel._tiles.isa() in builds["before"].isas():  # ATTNLAB_KERNEL_ISA picks both builds' variant
            builds["before"].isa(kernel._tiles.isa())
        amx = bool(getattr(kernel._tiles, "amx", lambda: False)())  # int4 keys' scores on AMX (ATTNLAB_KERNEL_AMX)
        if hasattr(builds["before"], "amx") and not amx:
            builds["before"].amx(False)
        amx = amx and kernel._tiles.isa() == "AVX-512"  # only that variant's int4 decoding uses it
        llc = llc_bytes()
        bandwidth = read_bandwidth(llc)
        rows = []
        for dtype in args.dtypes.split(","):
            for n in (int(x) for x in args.lengths.split(",")):
                rows.append({"dtype": dtype, "n": n, **measure(builds, dtype, n, llc, args.repeats)})
    load_avg = os.getloadavg()[0]
    print(f"read bandwidth {bandwidth:.1f} GB/s; load average {load_avg:.2f}; ISA {kernel._tiles.isa()}"
          f"{' with AMX' if amx else ''}; "
          f"before = {args.before}, after = this tree")
    print(f"{'dtype':9} {'n':>6} | {'before ms':>9} {'GB/s':>5} {'%bw':>4} | {'after ms':>8} {'GB/s':>5} {'%bw':>4} | "
          f"{'speed-up':>8} {'1-thread CPU':>12} | max diff")
    for r in rows:
        w, c, size = r["wall_s"], r["cpu_1thread_s"], r["bytes"]
        gbs = {b: size / w[b] / 1e9 for b in w}
        print(f"{r['dtype']:9} {r['n']:>6} | {w['before'] * 1e3:9.2f} {gbs['before']:5.1f} {100 * gbs['before'] / bandwidth:4.0f} | "
              f"{w['after'] * 1e3:8.2f} {gbs['after']:5.1f} {100 * gbs['after'] / bandwidth:4.0f} | "
              f"{w['before'] / w['after']:7.2f}x {c['before'] / c['after']:11.2f}x | {r['max_diff']:.1e}")
    by = {(r["dtype"], r["n"]): r for r in rows}
    for (dtype, n), r in by.items():
        if dtype != "float32" and ("float32", n) in by:
            f = by[("float32", n)]
            print(f"{dtype}/float32 step time at {n}: before {r['wall_s']['before'] / f['wall_s']['before']:.2f} "
                  f"(1-thread CPU {r['cpu_1thread_s']['before'] / f['cpu_1thread_s']['before']:.2f}), "
                  f"after {r['wall_s']['after'] / f['wall_s']['after']:.2f} "
                  f"(1-thread CPU {r['cpu_1thread_s']['after'] / f['cpu_1thread_s']['after']:.2f})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"before": args.before, "bandwidth_gbs": bandwidth, "llc_bytes": llc,
                                               "load_average": load_avg, "isa": kernel._tiles.isa(), "amx": amx, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
