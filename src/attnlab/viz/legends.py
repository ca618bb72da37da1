"""Legends that cover nothing: below the axes, outside the curves, lines and budgets they name
(the constrained layout makes room for them)."""

from __future__ import annotations

from typing import Any


def legend_below(ax: Any, *args: Any, fontsize: float = 8, ncols: int = 2, **kw: Any) -> Any:
    """``ax.legend(*args)`` under the axes' x label, in ``ncols`` columns, without a frame."""
    return ax.legend(*args, frameon=False, fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                     ncols=ncols, **kw)
