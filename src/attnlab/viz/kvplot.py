"""``attnlab kv``'s figure: each cache setting's KL divergence against its bytes per token, the Pareto front marked.

Built without pyplot (like :mod:`attnlab.viz.planplot`); it takes the plain dict of
:meth:`attnlab.interventions.kv_report.KVReport.to_dict`, never the report itself.
"""

from __future__ import annotations

from matplotlib.figure import Figure

KIND_COLORS = {"dense": "#4c72b0", "h2o": "#c44e52", "snapkv": "#55a868", "knorm": "#8172b3", "random": "#8c8c8c"}
FLOOR = 1e-12  # KL divergences at or below it sit on the axis' floor (a log axis has no zero)


def kv_figure(report: dict) -> Figure:
    """KL(float64 dense ‖ setting) (mean, log scale) against bytes per token; the points no other beats on both
    are joined (the Pareto front) and ringed; each point labelled by its setting."""
    fig = Figure(figsize=(8, 5.2), layout="constrained")
    ax = fig.add_subplot()
    rows = report["rows"]
    seen_at: dict[float, int] = {}  # points at one x take their labels right and left in turn
    for r in sorted(rows, key=lambda r: -r["kl_mean"]):
        kind = r["setting"].get("cache", "dense")
        ax.scatter(r["bytes_per_token"], max(r["kl_mean"], FLOOR), s=36, color=KIND_COLORS.get(kind, "#dd8452"),
                   zorder=3, label=kind)
        k = seen_at[r["bytes_per_token"]] = seen_at.get(r["bytes_per_token"], -1) + 1
        ax.annotate(r["name"], (r["bytes_per_token"], max(r["kl_mean"], FLOOR)), textcoords="offset points",
                    xytext=(-6, -3) if k % 2 else (6, 2), ha="right" if k % 2 else "left", fontsize=7.5)
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["bytes_per_token"])
    xs, ys = [r["bytes_per_token"] for r in front], [max(r["kl_mean"], FLOOR) for r in front]
    ax.plot(xs, ys, color="#222", lw=1, ls="--", zorder=2, label="Pareto front")
    ax.scatter(xs, ys, s=120, facecolors="none", edgecolors="#222", zorder=4)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))  # one entry per kind
    ax.legend(seen.values(), seen.keys(), fontsize=8, frameon=False)
    ax.set_yscale("log")
    ax.margins(x=0.15)  # room for the labels set left of the leftmost points
    ax.set_xlabel("cache bytes per token of the text (all layers, keys and values)")
    ax.set_ylabel("KL divergence from float64 dense (nats, mean)")
    ax.set_title(f"{report['model']}: {report['prompt_tokens']} prompt tokens, {report['scored_tokens']} scored "
                 f"(float32 settings)", fontsize=10, loc="left")
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return fig
