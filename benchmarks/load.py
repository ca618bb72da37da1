"""A competing load for the busy-machine figures: another program multiplying matrices on two threads.

    .venv/bin/python benchmarks/load.py [--seconds 60] [--threads 2] [--n 1024]

A NumPy float64 matrix product (n × n, OpenBLAS/MKL on ``--threads`` threads, set before NumPy loads)
repeated until ``--seconds`` pass or the process is stopped: what a laptop's other program does to a
generation (a build, a browser tab, a notebook). ``bench_decoder.py --loaded`` starts it beside its runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=1024)
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np

    a = np.random.default_rng(0).standard_normal((args.n, args.n))
    end, products = time.perf_counter() + args.seconds, 0
    while time.perf_counter() < end:
        a = a @ a
        a /= np.abs(a).max()  # stays finite
        products += 1
    print(f"load: {products} products of {args.n} x {args.n} on {args.threads} threads", file=sys.stderr)


if __name__ == "__main__":
    main()
