"""Markdown tables from a `attnlab bench --json` file, for benchmarks/README.md (numbers never typed by hand).

    .venv/bin/python benchmarks/tables.py benchmarks/results/attention.json [--targets | --ratios]
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


def ratios(result: dict) -> str:
    """blockwise (torch and NumPy input) against sdpa, row by row, from the same run."""
    by = {(m["method"], m["n"], m["heads"], m["causal"]): m["time_s"] for m in result["measurements"] if m["time_s"]}
    out = ["| heads | n | | blockwise-torch | blockwise-numpy | sdpa | blockwise-torch / sdpa |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for (meth, n, h, c), t in sorted(by.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][3])):
        sdpa = by.get(("sdpa", n, h, c))
        if meth != "blockwise-torch" or sdpa is None:
            continue
        numpy = by.get(("blockwise-numpy", n, h, c))
        cells = [f"{t * 1e3:,.1f}", "–" if numpy is None else f"{numpy * 1e3:,.1f}", f"{sdpa * 1e3:,.1f}", f"{t / sdpa:.2f}"]
        out.append(f"| {h} | {n} | {'causal' if c else 'full'} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def targets(result: dict) -> str:
    """The issue's targets as the run measured them (``targets`` in the JSON), one line each."""
    t, out = result.get("targets", {}), []
    verdict = {True: "met", False: "**missed**"}
    for r in t.get("blockwise_vs_sdpa", []):
        out.append(f"- blockwise (torch, full) / sdpa, n = {r['n']}, {r['heads']} h: {r['ratio']:.2f}x — {verdict[r['met']]}")
    for r in t.get("causal_saving", []):
        vs = "" if r["vs_sdpa_causal"] is None else f"; {r['vs_sdpa_causal']:.2f}x causal sdpa — {verdict[r['vs_sdpa_causal'] <= 1]}"
        out.append(f"- blockwise causal saving, n = {r['n']}, {r['heads']} h: {100 * r['saving']:.1f} % — {verdict[r['met']]}{vs}")
    for r in t.get("memory_65536", []):
        out.append(f"- blockwise extra memory, n = 65536, 1 h, {'causal' if r['causal'] else 'full'}: {r['peak_mb']:.1f} MB — {verdict[r['met']]}")
    auto = t.get("auto_vs_fastest", [])
    if auto:
        missed = [r for r in auto if not r["met"]]
        out.append(f"- auto / fastest torch backend: {len(auto) - len(missed)} of {len(auto)} within 1.1x"
                   + "".join(f"; {r['ratio']:.2f}x at n = {r['n']}, {r['heads']} h, {'causal' if r['causal'] else 'full'} [{r['chose']}]"
                             for r in missed))
        choice = [r["choice_ratio"] for r in auto if r.get("choice_ratio") is not None]
        if choice:
            good = sum(c <= 1.1 for c in choice)
            out.append(f"- the backend auto chose / fastest torch backend (their own medians): {good} of {len(choice)} "
                       f"within 1.1x, worst {max(choice):.2f}x")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        result = json.load(f)
    mode = sys.argv[2] if len(sys.argv) > 2 else None
    print({"--targets": targets, "--ratios": ratios}.get(mode, tables)(result))
