"""A decoding step's linear layers: attnlab's few-row path (``attnlab.transformer.linear``) against torch's.

    .venv/bin/python benchmarks/bench_linear.py [--rows 1,2,4,8] [--threads 2] [--rounds 7] [--json PATH]

The matrices of the Llama-style model of ``bench_generate.py`` (d = 512, 8 layers, 8 query heads
of 64, 2 k/v heads, SwiGLU 1,408, an untied 32,000-token unembedding), float32, each layer's seven
and the unembedding, cycled so that every product reads its weights from memory (their total is
far beyond the last-level cache). Per row count: the seconds of one sweep over all of them, medians
of ``--rounds`` interleaved rounds, the GB/s of weights read, and the ratio attnlab / torch; beside
them the read bandwidth of the machine (a sum over a buffer as large, measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

SHAPES = [(512, 512), (512, 128), (512, 128), (512, 512), (512, 1408), (512, 1408), (1408, 512)]  # (in, out)
LAYERS, VOCAB = 8, 32000


def main() -> None:
    import torch
    import torch.nn.functional as F

    from attnlab.transformer.linear import MAX_ROWS, linear

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not MAX_ROWS:
        raise SystemExit("attnlab.transformer._matvec was not built: nothing to compare")
    mats = [torch.randn(o, i) for _ in range(LAYERS) for i, o in SHAPES] + [torch.randn(VOCAB, 512)]
    nbytes = sum(w.nbytes for w in mats)
    flat = torch.randn(nbytes // 4)
    result = {"machine": {"threads": args.threads, "python": platform.python_version(), "torch": torch.__version__,
                          "cpu_count": os.cpu_count(), "load_average": os.getloadavg()},
              "weights_bytes": nbytes, "rows": {}}
    reads = []
    for r in [int(x) for x in args.rows.split(",")]:
        xs = {w.shape[1]: torch.randn(r, w.shape[1]) for w in mats}
        runs = {"attnlab": lambda: [linear(xs[w.shape[1]], w) for w in mats],
                "torch": lambda: [F.linear(xs[w.shape[1]], w) for w in mats]}
        for fn in [*runs.values()] * 3:  # warm: first calls' costs (page faults, thread start) are not the rate's
            fn()
        got = {name: [] for name in runs}
        for k in range(args.rounds):
            for name in (list(runs) if k % 2 == 0 else list(runs)[::-1]):
                t0 = time.perf_counter()
                runs[name]()
                got[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            flat.sum()
            reads.append(nbytes / (time.perf_counter() - t0))
        row = {name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                      "gbs": nbytes / statistics.median(ts) / 1e9} for name, ts in got.items()}
        row["ratio"] = row["attnlab"]["median_s"] / row["torch"]["median_s"]
        result["rows"][str(r)] = row
        print(f"rows {r}: attnlab {1e3 * row['attnlab']['median_s']:.2f} ms ({row['attnlab']['gbs']:.1f} GB/s), "
              f"torch {1e3 * row['torch']['median_s']:.2f} ms ({row['torch']['gbs']:.1f} GB/s), {row['ratio']:.2f}x",
              flush=True)
    result["read_bandwidth_gbs"] = statistics.median(reads) / 1e9
    result["machine"]["load_average_after"] = os.getloadavg()
    print(f"weights {nbytes / 1e6:.0f} MB per sweep; read bandwidth {result['read_bandwidth_gbs']:.1f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
