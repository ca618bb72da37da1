"""Activation patching as a heat map: how much of the clean run's behaviour each head (or each head at
each position) brings back into the corrupted run, 1 all of it, 0 none, below 0 the other way.
Drawn by :func:`attnlab.viz.heatmap.heatmap_grid` on a diverging scale; layers and heads 1-based on
the axes, as people read them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnlab.viz.heatmap import Cells, heatmap_grid

if TYPE_CHECKING:
    from matplotlib.figure import Figure

EFFECT = "effect (1: clean, 0: corrupted)"
PER_ROW = 2  # layers side by side in the per-position figure


def patching_figure(effect: Any, title: str, tokens: list[str] | None = None) -> Figure:
    """``effect`` [L, H] (one panel: layers down, heads across) or [L, H, T] (one panel per layer:
    heads down, the positions' ``tokens`` across), the normalised effect of patching each; the cells
    carry it in percent. ``title`` may hold a line break (a narrow grid has room for short lines)."""
    e = np.asarray(effect, dtype=np.float64)
    if e.ndim == 2:
        L, H = e.shape
        cells = Cells(value=EFFECT, rows="layer", cols="head", signed=True)
        panel = {"weights": e, "rows": [str(l + 1) for l in range(L)], "cols": [str(h + 1) for h in range(H)],
                 "title": ""}
        return heatmap_grid([panel], title=title, cells=cells)
    if e.ndim != 3:
        raise ValueError(f"effect must be [L, H] or [L, H, T], got shape {e.shape}")
    L, H, T = e.shape
    if tokens is None or len(tokens) != T:
        raise ValueError(f"tokens must name the {T} positions of effect [L, H, T], got {tokens!r}")
    cells = Cells(value=EFFECT, rows="head", cols="position (corrupted text)", signed=True)
    panels = [{"weights": e[l], "rows": [str(h + 1) for h in range(H)], "cols": list(tokens), "title": f"layer {l + 1}"}
              for l in range(L)]
    return heatmap_grid(panels, ncols=min(PER_ROW, L), title=title, shared_scale=True, cells=cells)
