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
    rows = sorted(report["rows"], key=lambda r: -r["kl_mean"])
    for r in rows:
        kind = r["setting"].get("cache", "dense")
        ax.scatter(r["bytes_per_token"], max(r["kl_mean"], FLOOR), s=36, color=KIND_COLORS.get(kind, "#dd8452"),
                   zorder=3, label=kind)
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["bytes_per_token"])
    xs, ys = [r["bytes_per_token"] for r in front], [max(r["kl_mean"], FLOOR) for r in front]
    ax.plot(xs, ys, color="#222", lw=1, ls="--", zorder=2, label="Pareto front")
    ax.scatter(xs, ys, s=120, facecolors="none", edgecolors="#222", zorder=4)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))  # one entry per kind
    ax.legend(seen.values(), seen.keys(), fontsize=8, frameon=False)
    ax.set_yscale("log")
    ax.margins(x=0.1)  # room for a label beside the leftmost and the rightmost points
    ax.set_xlabel("cache bytes per token of the text (all layers, keys and values)")
    ax.set_ylabel("KL divergence from float64 dense (nats, mean)")
    ax.set_title(f"{report['model']}: {report['prompt_tokens']} prompt tokens, {report['scored_tokens']} scored "
                 f"(float32 settings)", fontsize=10, loc="left")
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    _label(fig, ax, rows)
    return fig


SHIFTS = (0, -1, 1, -2, 2, -3, 3)  # a label's lines up or down from its point, tried in turn
LINE = 9.0  # points: a label's line at its 7.5-point size
GAP = 8.0  # points from a point's centre to its label, clear of the front's rings


def _label(fig: Figure, ax: object, rows: list[dict]) -> None:
    """Label each point by its setting, beside it, where the label stays inside the axes and covers no other label,
    point or the legend: right or left of the point (settings of one size in turn, towards the middle near
    the axis' ends), then a line lower or higher, the first place free. Placed as drawn, after the layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.transforms import Bbox

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # the layout: the axes' final place, which the labels' boxes are measured in
    frame = ax.get_window_extent(renderer)
    taken = [ax.get_legend().get_window_extent(renderer)]
    xy = [ax.transData.transform((r["bytes_per_token"], max(r["kl_mean"], FLOOR))) for r in rows]
    for r, (x, y) in zip(rows, xy):  # each marker, ringed on the front: half its side in pixels
        dot = (6 if r["pareto"] else 3.5) * fig.dpi / 72
        taken.append(Bbox.from_bounds(x - dot, y - dot, 2 * dot, 2 * dot))
    lo, hi = frame.x0 + 0.2 * frame.width, frame.x1 - 0.2 * frame.width
    turn: dict[float, int] = {}
    for r, (x, _) in zip(rows, xy):
        k = turn[r["bytes_per_token"]] = turn.get(r["bytes_per_token"], -1) + 1
        left = False if x < lo else True if x > hi else bool(k % 2)
        text = ax.annotate(r["name"], (r["bytes_per_token"], max(r["kl_mean"], FLOOR)), textcoords="offset points",
                           xytext=(GAP, 0), va="center", fontsize=7.5)
        first = None
        for shift in SHIFTS:
            for side in (left, not left):
                text.set_position((-GAP if side else GAP, shift * LINE))
                text.set_horizontalalignment("right" if side else "left")
                box = text.get_window_extent(renderer)
                first = first or (side, shift)
                if frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1) and \
                        not any(box.overlaps(b) for b in taken):
                    break
            else:
                continue
            break
        else:  # nowhere free: where it was first tried
            text.set_position((-GAP if first[0] else GAP, first[1] * LINE))
            text.set_horizontalalignment("right" if first[0] else "left")
        taken.append(text.get_window_extent(renderer))
