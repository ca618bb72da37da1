"""Markdown tables from a `attnlab bench --json` file, for benchmarks/README.md (numbers never typed by hand).

    .venv/bin/python benchmarks/tables.py benchmarks/results/attention.json
"""

from __future__ import annotations

import json
import sys


def tables(result: dict) -> str:
    ms = result["measurements"]
    out = []
    for key in sorted({(m["heads"], m["causal"]) for m in ms}):
        heads, causal = key
        sizes = sorted({m["n"] for m in ms if (m["heads"], m["causal"]) == key})
        methods = list(dict.fromkeys(m["method"] for m in ms))
        by = {(m["method"], m["n"]): m for m in ms if (m["heads"], m["causal"]) == key}
        out.append(f"\n**{heads} head{'s' if heads > 1 else ''}, {'causal' if causal else 'full'}** — "
                   "median ms (GFLOP/s, % of GEMM; peak extra MB)\n")
        out.append("| method | " + " | ".join(f"n = {n}" for n in sizes) + " |")
        out.append("| --- | " + " | ".join("---" for _ in sizes) + " |")
        for meth in methods:
            cells = []
            for n in sizes:
                m = by.get((meth, n))
                if m is None or m["time_s"] is None:
                    cells.append("skipped" if m is None else f"skipped ({m['skipped']})")
                    continue
                pct = "" if m["pct_of_gemm"] is None else f", {m['pct_of_gemm']:.0f} %"
                mem = "" if m["peak_bytes"] is None or meth == "gemm" else f"; {m['peak_bytes'] / 2**20:,.1f} MB"
                chose = f" [{m['backend']}]" if m["backend"] else ""
                cells.append(f"{m['time_s'] * 1e3:,.1f} ({m['gflops']:.1f}{pct}{mem}){chose}")
            out.append(f"| {meth} | " + " | ".join(cells) + " |")
        errs = {meth: max((m["max_error"] for m in ms if m["method"] == meth and m["max_error"] is not None), default=None)
                for meth in methods}
        out.append("\nmax error vs float64: " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items() if v is not None))
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(tables(json.load(f)))
