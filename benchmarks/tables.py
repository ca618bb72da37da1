"""Markdown tables from a `attnlab bench --json` file, for benchmarks/README.md (numbers never typed by hand).

    .venv/bin/python benchmarks/tables.py benchmarks/results/attention.json [--targets | --ratios | --auto]

``--targets`` and ``--auto`` are the issue's targets judged on the file (:mod:`targets`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script from anywhere: targets.py sits here

from targets import auto_table, fast_method, summary  # noqa: E402


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


def ratios(result: dict) -> str:
    """The compiled kernel and the blockwise loop (torch and NumPy input) against sdpa, row by row, from the same run."""
    by = {(m["method"], m["n"], m["heads"], m["causal"]): m["time_s"] for m in result["measurements"] if m["time_s"]}
    fast = fast_method(result)
    loops = [x for x in ("blockwise-torch", "blockwise-numpy") if x != fast]
    out = [f"| heads | n | | {fast} | " + " | ".join(loops) + f" | sdpa | {fast} / sdpa |",
           "| --- | --- | --- | --- | " + " | ".join("---" for _ in loops) + " | --- | --- |"]
    for (meth, n, h, c), t in sorted(by.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][3])):
        sdpa = by.get(("sdpa", n, h, c))
        if meth != fast or sdpa is None:
            continue
        cells = [f"{t * 1e3:,.1f}"] + ["–" if (x, n, h, c) not in by else f"{by[x, n, h, c] * 1e3:,.1f}" for x in loops]
        cells += [f"{sdpa * 1e3:,.1f}", f"{t / sdpa:.2f}"]
        out.append(f"| {h} | {n} | {'causal' if c else 'full'} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        result = json.load(f)
    mode = sys.argv[2] if len(sys.argv) > 2 else None
    print({"--targets": summary, "--ratios": ratios, "--auto": auto_table}.get(mode, tables)(result))
