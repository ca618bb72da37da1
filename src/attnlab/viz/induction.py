"""Section 8's figure: an induction head being learned (the loss drop, the scores, the two heads' maps).

Like :mod:`attnlab.viz.figures`, it takes the section's ``data`` (as in ``lesson.json``) and returns a
matplotlib ``Figure`` built without pyplot. The maps are 48 × 48, too many cells to print numbers
in, so they are drawn as plain images with the repeat framed.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from attnlab.viz.legends import legend_below

LOSS, PREV, IND = "#333333", "#4c72b0", "#c44e52"


def induction_training(data: dict) -> Figure:
    """Loss on the repeat and best scores per layer over the steps; the two heads' maps before and after."""
    h = data["history"]
    fig = Figure(figsize=(10.4, 4.4), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1.15, 1])
    ax = left.subplots()
    ax.plot(h["step"], h["repeat_loss"], color=LOSS, label="loss on the repeat (nats)")
    ax.axhline(data["chance_loss"], color=LOSS, ls=":", lw=1, label="chance, ln V")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss on the repeat (nats)")
    ax.set_ylim(bottom=0)
    ax.spines[["top"]].set_visible(False)
    sc = ax.twinx()
    sc.plot(h["step"], [p[0] for p in h["previous_token"]], color=PREV, label="previous-token score, layer 1")
    sc.plot(h["step"], [i[1] for i in h["induction"]], color=IND, label="induction score, layer 2")
    sc.set_ylim(0, 1)
    sc.set_ylabel("best head's score")
    lines = ax.get_lines() + sc.get_lines()
    legend_below(ax, lines, [ln.get_label() for ln in lines])
    ax.set_title("The sudden drop: copying is learned")
    grid = right.subplots(2, 2)
    repeat = np.flatnonzero(np.asarray(data["example"]["repeat"]))
    for col, when in enumerate(("before", "after")):
        for row, role in enumerate(("previous_token_head", "induction_head")):
            layer, head = data[role]["layer"], data[role]["head"]  # 0-based, as lesson.json names heads
            a = grid[row, col]
            a.imshow(np.asarray(data["maps"][when][layer][head]), cmap="Blues", vmin=0, vmax=1)
            if repeat.size:  # frame the rows of the repeat, where the induction head copies
                a.axhspan(repeat[0] - 1.5, repeat[-1] - 0.5, color=IND, alpha=0.12, lw=0)
            a.set_xticks([])
            a.set_yticks([])
            a.set_title(f"layer {layer + 1}, head {head + 1}, {when}", fontsize=9)
            if col == 0:
                a.set_ylabel("previous-token" if layer == 0 else "induction", fontsize=9)
    right.suptitle("Where the two heads look (query ↓, key →)\nshaded: the rows of the repeat", fontsize=10)
    return fig


def induction_circuit(data: dict) -> Figure:
    """The circuit's proof: activation patching's [2, H] grid as a heat map, and the path-patching effects of
    the sender (the layer-1 head of largest effect through k) into the head found, through q, k and v."""
    d = data["circuit"]
    grid = np.asarray(d["patching"]["effect"])
    head, sender = d["head"], d["sender"]  # 0-based, as lesson.json names heads
    fig = Figure(figsize=(10.4, 3.6), layout="constrained")
    heat, bars = fig.subplots(1, 2, width_ratios=[1.5, 1])
    span = max(float(np.abs(grid).max()), 1e-9)
    im = heat.imshow(grid, cmap="RdBu", vmin=-span, vmax=span, aspect="auto")
    for (layer, h), value in np.ndenumerate(grid):
        heat.text(h, layer, f"{value:.0%}", ha="center", va="center", fontsize=9,
                  color="white" if abs(value) > 0.6 * span else "black", fontweight="bold" if (layer, h) == (head["layer"], head["head"]) else "normal")
    heat.set_xticks(range(grid.shape[1]), [f"head {h + 1}" for h in range(grid.shape[1])])
    heat.set_yticks(range(grid.shape[0]), [f"layer {layer + 1}" for layer in range(grid.shape[0])])
    heat.set_title("Activation patching: share of the log-probability restored", fontsize=10)
    from matplotlib.ticker import PercentFormatter

    fig.colorbar(im, ax=heat, shrink=0.8, format=PercentFormatter(xmax=1, decimals=0))  # percent, as the cells
    inputs = ("q", "k", "v")
    values = [d["path"][w][sender["head"]] for w in inputs]
    bars.bar([f"through {w}" for w in inputs], values, color=[PREV if w == "k" else "#999999" for w in inputs])
    for i, v in enumerate(values):
        bars.text(i, v, f"{v:.1%}", ha="center", va="bottom", fontsize=9)
    bars.axhline(0, color=LOSS, lw=0.8)
    bars.set_ylim(min(0.0, *values) - 0.05, max(1.0, *values) * 1.12)
    bars.set_ylabel("share of the attention restored")
    bars.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))  # as the bars' own labels
    bars.spines[["top", "right"]].set_visible(False)
    bars.set_title(f"Path patching:\nlayer 1, head {sender['head'] + 1} → layer {head['layer'] + 1}, "
                   f"head {head['head'] + 1}", fontsize=10)  # two lines: one ran past the figure's edge
    return fig
