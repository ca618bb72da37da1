"""Legends that cover nothing: below the axes, outside the curves, lines and budgets they name
(the constrained layout makes room for them), in as many columns as the axes' width holds."""

from __future__ import annotations

from typing import Any

CHAR_EMS = 0.55  # a label's character, on average, in ems of its font (DejaVu Sans)
ENTRY_INCHES = 0.55  # a legend entry's handle and the gaps around it


def _columns(ax: Any, labels: list[str], fontsize: float, most: int) -> int:
    """As many columns as fit under ``ax`` (at most ``most``): two columns of long labels are wider than a
    panel, and the constrained layout then pushed the panels apart while the legends ran into each other."""
    longest = max((len(line) for label in labels for line in str(label).split("\n")), default=0)
    entry = longest * CHAR_EMS * fontsize / 72 + ENTRY_INCHES  # inches
    root = getattr(ax.figure, "figure", None) or ax.figure  # a subfigure's root figure holds the size
    width = ax.get_position().width * root.get_figwidth()
    return max(1, min(most, int(width // entry)))


def legend_below(ax: Any, *args: Any, fontsize: float = 8, ncols: int = 2, **kw: Any) -> Any:
    """``ax.legend(*args)`` under the axes' x label, in at most ``ncols`` columns (fewer where the labels are
    too long for the axes' width), without a frame."""
    labels = args[1] if len(args) == 2 else args[0] if len(args) == 1 else ax.get_legend_handles_labels()[1]
    return ax.legend(*args, frameon=False, fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                     ncols=_columns(ax, list(labels), fontsize, ncols), **kw)
