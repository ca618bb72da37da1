"""The planner's figures: latency and memory against context, with the deadline and the budget drawn.

Built without pyplot (like :mod:`attnlab.viz.figures`): the caller saves the returned Figure. Each
function takes plain dicts (:meth:`attnlab.planner.Plan.to_dict`), never the planner's objects.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from attnlab.viz.legends import legend_below

COLORS = {"ttft": "#4c72b0", "total": "#c44e52", "tpot": "#55a868", "weights": "#8c8c8c", "kv": "#dd8452",
          "activations": "#8172b3"}


def _tokens(x: float, _: object = None) -> str:
    return f"{x / 1000:g}k" if x >= 1000 else f"{x:g}"


TICKS = (128, 256, 512, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 512000, 1000000)


def _axes(ax, xlabel: bool = True) -> None:  # noqa: ANN001
    ax.set_xscale("log", base=2)
    lo, hi = ax.get_xlim()
    ax.set_xticks([t for t in TICKS if lo <= t <= hi])
    ax.xaxis.set_major_formatter(FuncFormatter(_tokens))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    if xlabel:
        ax.set_xlabel("prompt (tokens)")


def draw_plan(ax_time, ax_mem, curve: dict, asked: dict | None = None, label: str = "") -> None:  # noqa: ANN001
    """One plan's curves on two axes: TTFT and total (log seconds), and memory stacked by part (GB)."""
    rows = curve["rows"]
    ns = [r["prompt_tokens"] for r in rows]
    tag = f"{label}: " if label else ""
    ax_time.plot(ns, [r["ttft_s"] for r in rows], color=COLORS["ttft"], label=f"{tag}first token (TTFT)")
    ax_time.plot(ns, [r["total_s"] for r in rows], color=COLORS["total"],
                 label=f"{tag}total ({curve['new_tokens']} new tokens)")
    ax_time.plot(ns, [r["tpot_s"] * 100 for r in rows], color=COLORS["tpot"], ls="--", label=f"{tag}100 × TPOT")
    _ranges(ax_time, rows, ns)
    ax_time.set_yscale("log")
    ax_time.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g} s"))
    parts = ([r["weight_bytes"] / 1e9 for r in rows], [r["kv_bytes"] / 1e9 for r in rows],
             [(r["peak_bytes"] - r["weight_bytes"] - r["kv_bytes"]) / 1e9 for r in rows])
    ax_mem.stackplot(ns, *parts, colors=[COLORS["weights"], COLORS["kv"], COLORS["activations"]], alpha=0.8,
                     labels=["weights", "KV cache (after the last token)", "prefill activations (at the peak)"])
    if asked:
        for r in asked["rows"]:
            ax_time.plot([r["prompt_tokens"]] * 2, [r["ttft_s"], r["total_s"]], "o", color="#222", ms=3.5)
            ax_mem.plot(r["prompt_tokens"], r["peak_bytes"] / 1e9, "o", color="#222", ms=3.5)
    if curve.get("deadline_ms"):
        ax_time.axhline(curve["deadline_ms"] / 1000, color="#222", lw=1, ls=":",
                        label=f"deadline {curve['deadline_ms']:g} ms ({curve['deadline_on']})")
    ax_mem.axhline(curve["memory_bytes"] / 1e9, color="#222", lw=1, ls=":", label=f"budget {curve['memory_bytes'] / 1e9:,.1f} GB")
    if curve.get("max_prompt_tokens"):
        for ax in (ax_time, ax_mem):
            ax.axvline(curve["max_prompt_tokens"], color="#2ca02c", lw=1, ls="-.", label=_largest_label(curve))


def _largest_label(curve: dict) -> str:
    """What the vertical line is: the largest prompt meeting the limits, with its range, or the model's positions
    when the search reached them (the memory would allow more)."""
    n = curve["max_prompt_tokens"]
    if curve["search"]["capped"]:  # two lines: one ran past the figure's edge in the lesson's serving figure
        return f"the model's positions (less the new tokens): {n:,};\nmemory allows more"
    span = curve.get("max_prompt_range")
    within = f" ({span[0]:,}–{span[1]:,})" if span and span[0] != span[1] else ""
    return f"largest prompt {'meeting both' if curve.get('deadline_ms') else 'that fits'}: {n:,}{within}"


def _ranges(ax, rows: list[dict], ns: list[int]) -> None:  # noqa: ANN001
    """Each latency curve's band: the fast and slow ends of the measurements it rests on (none when unknown)."""
    for key, scale in (("ttft_s", 1), ("total_s", 1), ("tpot_s", 100)):
        spans = [r["ranges"][key] for r in rows]
        if all(spans):
            ax.fill_between(ns, [lo * scale for lo, _ in spans], [hi * scale for _, hi in spans],
                            color=COLORS[key[:-2]], alpha=0.15, lw=0)


def plan_figure(curve: dict, asked: dict | None = None) -> Figure:
    """``curve``: a plan over many prompt lengths; ``asked``: the plan of the lengths asked (marked as dots)."""
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    ax_time, ax_mem = fig.subplots(1, 2)
    draw_plan(ax_time, ax_mem, curve, asked)
    for ax in (ax_time, ax_mem):
        _axes(ax)
        legend_below(ax)
    ax_time.set_ylabel("seconds")
    ax_mem.set_ylabel("GB (10⁹ bytes) per device")
    hw = curve["hardware"]
    kind = ("predicted from rates measured here; bands: their range" if hw["measured"]
            else "predicted: datasheet × efficiencies fitted to published rows; bands: their held-out error"
            if hw["details"].get("validation") else "predicted: datasheet × assumed efficiencies")
    fig.suptitle(f"{curve['model']['name']} on {hw['name']}{' × %d' % curve['gpus'] if curve['gpus'] > 1 else ''} "
                 f"({kind}), {curve['dtype']}, batch {curve['batch']}", fontsize=10)
    return fig


def serving_figure(data: dict) -> Figure:
    """The lesson's cost section: the planner's curves for one model here and on one accelerator."""
    serving = data["serving"]
    plans = serving["curves"]
    fig = Figure(figsize=(11, 4.0 * len(plans)), layout="constrained")
    axes = fig.subplots(len(plans), 2, squeeze=False)
    for (ax_time, ax_mem), (where, curve) in zip(axes, plans.items()):
        draw_plan(ax_time, ax_mem, curve, serving["plans"][where])
        for ax in (ax_time, ax_mem):
            _axes(ax)
            legend_below(ax, fontsize=7, ncols=1)  # two columns of these labels ran into the next panel's
        kind = "predicted from rates measured here" if curve["hardware"]["measured"] else "predicted"
        # two lines: on one, the machine's name ran past the figure's left edge
        ax_time.set_title(f"{curve['model']['name']} on {curve['hardware']['name']}\n({kind}): latency", fontsize=9)
        ax_mem.set_title("memory", fontsize=9)
        ax_time.set_ylabel("seconds")
        ax_mem.set_ylabel("GB (10⁹ bytes)")
    return fig
