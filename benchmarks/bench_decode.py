"""Decoding: one query row per head against a long key/value cache, where a step's work is reading the cache.

    .venv/bin/python benchmarks/bench_decode.py [--quick] [--lengths 4096,8192,...,131072] [--repeats 5]
        [--threads 2] [--json benchmarks/results/decode.json]

The same measurement as ``attnlab bench --decode`` (:mod:`attnlab.bench.decode` says what each number
is): B = 1, H = 32, H_kv = 8, D = 128, caches of 4,096 … 131,072 keys in float32, bfloat16 and float16.
First this machine's read bandwidth (a sum over a buffer of 8 times the last-level cache, with
torch's threads), then per cache: the median time of one step, GB/s of K and V as stored, that as %
of the bandwidth, and the ratios to SDPA (``enable_gqa``, or k/v repeated to 32 heads beforehand,
untimed: the faster) and to the compiled kernel's many-row tiles path. Two rows are attnlab's:
``attention`` is a plain ``attnlab.attention(q, k, v, causal=True, backend="kernel")`` call;
``generate`` is the read ``Transformer.generate`` makes at each step, through the same
``Reads`` (auto's backend, which the table names, chosen once per length bucket and then called
directly). Short caches are rotated (several whose total is at least twice the
last-level cache), so every figure is a read from memory. ``--quick``: caches of 256 and 1,024 keys,
2 rounds (a smoke run; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import sys

QUICK = ["--sizes", "256,1024", "--repeats", "2"]


def main(argv: list[str] | None = None) -> int:
    from attnlab.cli.app import main as attnlab

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny caches, 2 rounds: a smoke run")
    ap.add_argument("--lengths", help="cache lengths, comma-separated (default 4096 … 131072)")
    ap.add_argument("--repeats", default="5", help="timed rounds per method (median reported)")
    ap.add_argument("--threads", help="torch threads while measuring (default: torch's)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON here instead of the table")
    args = ap.parse_args(argv)
    cli = ["bench", "--decode", "--repeats", args.repeats]
    if args.quick:
        cli += QUICK
    elif args.lengths:
        cli += ["--sizes", args.lengths]
    cli += ["--threads", args.threads] if args.threads else []
    cli += ["--json", args.json] if args.json else []
    return attnlab(cli)


if __name__ == "__main__":
    sys.exit(main())
