"""Section 8's figure: an induction head being learned (the loss drop, the scores, the two heads' maps).

Like :mod:`attnlab.viz.figures`, it takes the section's ``data`` (as in ``lesson.json``) and returns a
matplotlib ``Figure`` built without pyplot. The maps are 48 × 48, too many cells to print numbers
in, so they are drawn as plain images with the repeat framed.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

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
    ax.legend(lines, [ln.get_label() for ln in lines], frameon=False, fontsize=8, loc="center right")
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
    right.suptitle("Where the two heads look (query ↓, key →)", fontsize=10)
    return fig
