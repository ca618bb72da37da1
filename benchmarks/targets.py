"""The restructure issue's one-off targets, judged on one `attnlab bench --json` file (ratios of the same run).

    .venv/bin/python benchmarks/targets.py benchmarks/results/attention.json [--auto]

The library measures; the verdicts live here, with the thresholds the issue set:

- the compiled online softmax (``kernel``) against sdpa, full attention, n ≥ 2048: ≤ 1.3×;
- its causal saving against its own full time, n ≥ 8192: ≥ 45 %;
- its peak extra memory at n = 65 536, one head: < 64 MB;
- auto against the fastest backend on tensors, every row: ≤ 1.1×.

Files from before the kernel had its own method name hold it as ``blockwise-torch`` (the method
then ran the compiled kernel); :func:`fast_method` reads those too.
"""

from __future__ import annotations

import json
import sys
from typing import Any

KERNEL_VS_SDPA = 1.3
CAUSAL_SAVING = 0.45
MEMORY_MB = 64.0
AUTO_VS_FASTEST = 1.1
TENSOR_METHODS = ("torch", "sdpa", "blockwise-torch", "kernel")  # what auto chooses among for tensors
METHOD_OF = {"blockwise": "blockwise-torch"}  # auto's backend name → the method that runs it on tensors


def fast_method(result: dict) -> str:
    """The method that ran the compiled kernel: ``kernel``, or ``blockwise-torch`` in older files."""
    return "kernel" if any(m["method"] == "kernel" for m in result["measurements"]) else "blockwise-torch"


def targets(result: dict) -> dict[str, list[dict[str, Any]]]:
    """Each target's rows: the measured ratio and whether it met the threshold."""
    by = {(m["method"], m["n"], m["heads"], m["causal"]): m for m in result["measurements"] if m["time_s"] is not None}
    fast = fast_method(result)
    out: dict[str, list[dict[str, Any]]] = {"kernel_vs_sdpa": [], "causal_saving": [], "memory_65536": [], "auto_vs_fastest": []}
    for (meth, n, h, c), m in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0])):
        if meth == fast and not c and n >= 2048 and ("sdpa", n, h, False) in by:
            r = m["time_s"] / by["sdpa", n, h, False]["time_s"]
            out["kernel_vs_sdpa"].append({"n": n, "heads": h, "ratio": r, "met": r <= KERNEL_VS_SDPA})
        if meth == fast and c and n >= 8192 and (fast, n, h, False) in by:
            saving = 1 - m["time_s"] / by[fast, n, h, False]["time_s"]
            sd = by.get(("sdpa", n, h, True))
            out["causal_saving"].append({"n": n, "heads": h, "saving": saving, "met": saving >= CAUSAL_SAVING,
                                         "vs_sdpa_causal": None if sd is None else m["time_s"] / sd["time_s"]})
        if meth == fast and n == 65536 and h == 1 and m["peak_bytes"] is not None:
            mb = m["peak_bytes"] / 2**20
            out["memory_65536"].append({"causal": c, "peak_mb": mb, "met": mb < MEMORY_MB})
        if meth == "auto":
            rivals = {x: by[x, n, h, c]["time_s"] for x in TENSOR_METHODS if (x, n, h, c) in by}
            if rivals:
                best = min(rivals, key=rivals.get)
                chosen = METHOD_OF.get(m["backend"], m["backend"])
                out["auto_vs_fastest"].append({
                    "n": n, "heads": h, "causal": c, "chose": m["backend"], "fastest": best,
                    "ratio": m["time_s"] / rivals[best], "met": m["time_s"] / rivals[best] <= AUTO_VS_FASTEST,
                    # the chosen backend's own median against the fastest: the choice, without auto's timing noise
                    "choice_ratio": rivals[chosen] / rivals[best] if chosen in rivals else None,
                })
    return out


def summary(result: dict) -> str:
    """The targets as a Markdown list, one line per row (misses say so)."""
    t, out = targets(result), []
    verdict = {True: "met", False: "**missed**"}
    for r in t["kernel_vs_sdpa"]:
        out.append(f"- kernel (full) / sdpa, n = {r['n']}, {r['heads']} h: {r['ratio']:.2f}x — {verdict[r['met']]}")
    for r in t["causal_saving"]:
        vs = "" if r["vs_sdpa_causal"] is None else f"; {r['vs_sdpa_causal']:.2f}x causal sdpa"
        out.append(f"- kernel causal saving, n = {r['n']}, {r['heads']} h: {100 * r['saving']:.1f} % — {verdict[r['met']]}{vs}")
    for r in t["memory_65536"]:
        out.append(f"- kernel extra memory, n = 65536, 1 h, {'causal' if r['causal'] else 'full'}: "
                   f"{r['peak_mb']:.1f} MB — {verdict[r['met']]}")
    auto = t["auto_vs_fastest"]
    if auto:
        missed = [r for r in auto if not r["met"]]
        out.append(f"- auto / fastest backend on tensors: {len(auto) - len(missed)} of {len(auto)} within {AUTO_VS_FASTEST}x"
                   + "".join(f"; {r['ratio']:.2f}x at n = {r['n']}, {r['heads']} h, {'causal' if r['causal'] else 'full'} "
                             f"[{r['chose']}, fastest {r['fastest']}]" for r in missed))
        choice = [r["choice_ratio"] for r in auto if r["choice_ratio"] is not None]
        if choice:
            good = sum(c <= AUTO_VS_FASTEST for c in choice)
            out.append(f"- the backend auto chose / fastest (their own medians): {good} of {len(choice)} "
                       f"within {AUTO_VS_FASTEST}x, worst {max(choice):.2f}x")
    return "\n".join(out)


def auto_table(result: dict) -> str:
    """auto ÷ the fastest backend on tensors, row by row (ms), as a Markdown table."""
    by = {(m["method"], m["n"], m["heads"], m["causal"]): m["time_s"] for m in result["measurements"] if m["time_s"]}
    shown = [x for x in TENSOR_METHODS if any(k[0] == x for k in by)]
    out = ["| heads | n | | " + " | ".join(shown) + " | auto | auto chose | auto / fastest | chosen / fastest |",
           "| --- | --- | --- | " + " | ".join("---" for _ in shown) + " | --- | --- | --- | --- |"]
    rows = sorted(targets(result)["auto_vs_fastest"], key=lambda r: (r["heads"], r["n"], r["causal"]))
    for r in rows:
        key = (r["n"], r["heads"], r["causal"])
        cells = ["–" if (x, *key) not in by else f"{by[(x, *key)] * 1e3:,.2f}" for x in shown]
        cells += [f"{by[('auto', *key)] * 1e3:,.2f}", r["chose"], f"{r['ratio']:.2f}" + ("" if r["met"] else " **missed**"),
                  "–" if r["choice_ratio"] is None else f"{r['choice_ratio']:.2f}"]
        out.append(f"| {r['heads']} | {r['n']} | {'causal' if r['causal'] else 'full'} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        data = json.load(f)
    print(auto_table(data) if "--auto" in sys.argv[2:] else summary(data))
