"""The benchmark's figure: time and peak extra memory against n, one column per (heads, causal).

Built without pyplot (like :mod:`attnlab.viz.figures`): the caller saves the returned Figure.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

STYLE = {  # one colour and marker per method, the same in every panel
    "naive": ("#8c8c8c", "x"), "numpy": ("#937860", "s"), "torch": ("#dd8452", "^"), "sdpa": ("#4c72b0", "o"),
    "blockwise-numpy": ("#55a868", "v"), "blockwise-torch": ("#64b5cd", "<"), "kernel": ("#c44e52", "D"),
    "auto": ("#8172b3", "+"), "gemm": ("#000000", "."),
}


def bench_figure(result: dict[str, Any]) -> Figure:
    """``result``: the dict of :meth:`attnlab.bench.BenchResult.to_dict`."""
    ms = [m for m in result["measurements"] if m["time_s"] is not None]
    panels = sorted({(m["heads"], m["causal"]) for m in ms})
    fig = Figure(figsize=(3.6 * max(1, len(panels)), 6.4), layout="constrained")
    axes = fig.subplots(2, max(1, len(panels)), squeeze=False)
    handles = {}  # one legend entry per method shown anywhere
    for col, (heads, causal) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        for method, (color, marker) in STYLE.items():
            pts = sorted((m["n"], m["time_s"], m["peak_bytes"]) for m in ms
                         if m["method"] == method and m["heads"] == heads and m["causal"] == causal)
            if not pts:
                continue
            ns = [p[0] for p in pts]
            (handles[method],) = top.plot(ns, [p[1] * 1e3 for p in pts], marker=marker, color=color, label=method, lw=1.2, ms=4)
            mem = [(n, p[2] / 2**20) for n, p in zip(ns, pts) if p[2]]
            if mem and method != "gemm":
                bottom.plot(*zip(*mem), marker=marker, color=color, label=method, lw=1.2, ms=4)
        title = f"{heads} head{'s' if heads > 1 else ''}, {'causal' if causal else 'full'}"
        top.set_title(title, fontsize=10)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="major", alpha=0.3)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.spines[["top", "right"]].set_visible(False)
        bottom.set_xlabel("n (tokens), d = %d" % ms[0]["d"] if ms else "n")
        if col == 0:
            top.set_ylabel("time per call (ms, median)")
            bottom.set_ylabel("peak extra memory (MB)")
    if panels:
        axes[0][-1].legend([handles[m] for m in STYLE if m in handles], [m for m in STYLE if m in handles],
                           fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    cpu = result.get("machine", {}).get("cpu", "")
    fig.suptitle(f"attention forward, float32 — {cpu}, {result.get('machine', {}).get('cores')} cores", fontsize=10)
    return fig
