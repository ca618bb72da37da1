"""Attention forward, every method, n from 512 up: the same sweep as `attnlab bench`, by hand.

    .venv/bin/python benchmarks/bench_attention.py [attnlab bench flags]
    .venv/bin/python benchmarks/bench_attention.py --sizes 512,1024 --heads 1 --repeats 2     # under a minute
    .venv/bin/python benchmarks/bench_attention.py --sizes 65536 --heads 1 \\
        --methods sdpa,kernel,gemm --repeats 1 --json benchmarks/results/mem_65536.json

One implementation (attnlab.bench) serves both this script and the CLI; this file only forwards
its arguments. Results, with the machine they come from, are in benchmarks/README.md.
"""

from __future__ import annotations

import sys

from attnlab.cli.app import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
