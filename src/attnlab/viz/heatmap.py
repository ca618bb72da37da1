"""Attention heatmaps with matplotlib: who attends (rows) to whom (columns), tokens on both axes.

Built on ``matplotlib.figure.Figure`` rather than pyplot, so no global figure state is touched and
no display is needed; save with ``fig.savefig(path)``.
"""

from __future__ import annotations

from dataclasses import dataclass
import textwrap
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TITLE_CHARS_PER_INCH = 9  # characters of a panel's title per inch of panel, at the title's size
ANNOTATE_MAX = 16  # label every cell with its percentage up to this many rows and columns
CELL_INCHES = 0.42
ANNOTATE_POINTS = 8  # cell numbers: 12 px at the report's 110 dpi, readable when the figure fits the page
HIGHLIGHT = "#c0392b"  # the row a figure is about (the viewer's accent colour)
PAGE_INCHES = 1150 / 110  # the report's page (1150 px) at its 110 dpi: a wider figure is shrunk, and its text with it
LABEL_INCHES = 1.1  # a panel's title, its rotated column labels and its axis label, below and above the cells


@dataclass(frozen=True)
class Cells:
    """What a heat map's cells hold: the colour bar's name, the axes' names, and whether the values
    take both signs (then a diverging scale, red below 0 and blue above, symmetric about 0)."""

    value: str = "weight"
    rows: str = "attending (query)"
    cols: str = "attended to (key)"
    signed: bool = False

    @property
    def cmap(self) -> str:
        return "RdBu" if self.signed else "Blues"


WEIGHTS = Cells()  # attention weights, in 0..1


def percent_bar(bar: Any) -> Any:
    """A colour bar whose ticks read in percent, as the cells' numbers do (a cell reads -6 where the bar
    would read -0.06 as a fraction)."""
    from matplotlib.ticker import FuncFormatter

    # "35%", not "35.0%" beside cells that read 35; a fraction of a percent keeps its digits ("2.5%")
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{100 * x:.3g}%".replace("-", "\u2212")))
    return bar


def wrap_title(title: str, width: int) -> str:
    """A panel's title in lines of at most ``width`` characters, broken first after its lead ("marks ([CLS], [SEP],
    punctuation):" above "layer 3, head 10, average 94 %"), a number never apart from its "%"."""
    text = title.replace(" %", "\u00a0%")
    if len(text) <= width:
        return text
    lead, sep, rest = text.partition(": ")
    return "\n".join(textwrap.fill(part, width) for part in ([lead + ":", rest] if sep and rest else [text]))


def plot_heatmap(
    weights2d: Any,
    row_labels: list[str],
    col_labels: list[str],
    title: str | None = None,
    ax: Any = None,
    *,
    annotate: bool | None = None,
    highlight_rows: tuple[int, ...] = (),
    vmax: float | None = None,
    colorbar: bool = True,
    cells: Cells = WEIGHTS,
):
    """Draw one attention map [Tq, Tk] (weights in 0..1) and return the Figure.

    Rows are the tokens attending (queries), columns the tokens attended to (keys). Cells carry
    their weight in percent when the map is small enough to read (``annotate=None``: up to
    :data:`ANNOTATE_MAX` tokens). ``highlight_rows`` (0-based) are framed and their labels set in
    bold red: the word the figure is about. ``vmax``: the top of the colour scale (default: the
    map's largest weight, or largest magnitude for signed cells, whose scale runs from −vmax to
    vmax); ``colorbar=False`` leaves the scale to the caller (one for several maps). ``cells``: what
    else than attention weights the grid holds (a patching effect per layer and head, say).
    """
    from matplotlib.figure import Figure

    w = np.asarray(weights2d, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"weights2d must be 2-D [Tq, Tk], got shape {w.shape}")
    if len(row_labels) != w.shape[0] or len(col_labels) != w.shape[1]:
        raise ValueError(
            f"labels do not fit weights2d of shape {w.shape}: {len(row_labels)} row labels, "
            f"{len(col_labels)} column labels"
        )
    if ax is None:
        side = max(3.5, CELL_INCHES * max(w.shape) + 1.8)
        fig = Figure(figsize=(side + 0.8, side), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    top = max(1e-9, float(np.abs(w).max() if cells.signed else w.max()) if vmax is None else vmax)
    image = ax.imshow(w, cmap=cells.cmap, vmin=-top if cells.signed else 0.0, vmax=top, aspect="equal")
    ax.set_xticks(range(w.shape[1]), col_labels, rotation=60, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(w.shape[0]), row_labels)
    ax.set_xlabel(cells.cols)
    ax.set_ylabel(cells.rows)
    ax.tick_params(length=0)
    if annotate is None:
        annotate = max(w.shape) <= ANNOTATE_MAX
    if annotate:
        dark = 0.6 * top
        for i, j in np.ndindex(*w.shape):
            ax.text(j, i, f"{round(100 * w[i, j])}", ha="center", va="center", fontsize=ANNOTATE_POINTS,
                    color="white" if abs(w[i, j]) > dark else "black", gid="cell")
    for r in highlight_rows:
        from matplotlib.patches import Rectangle

        ax.add_patch(Rectangle((-0.5, r - 0.5), w.shape[1], 1, fill=False, edgecolor=HIGHLIGHT, lw=2.5,
                               clip_on=False, gid="highlight"))
        label = ax.get_yticklabels()[r]
        label.set_color(HIGHLIGHT)
        label.set_fontweight("bold")
    if title:
        ax.set_title(title)
    if colorbar:
        percent_bar(fig.colorbar(image, ax=ax, shrink=0.8, label=cells.value))
    return fig


def plot_maps(maps2d: list[Any], labels: list[list[str]], title: str | None = None):
    """One head's map for several sentences, side by side: ``maps2d[i]`` [T_i, T_i] labelled by ``labels[i]``."""
    if len(maps2d) != len(labels) or not maps2d:
        raise ValueError(f"plot_maps needs one label list per map, got {len(maps2d)} maps and {len(labels)} label lists")
    return heatmap_grid([{"weights": w, "rows": lab, "cols": lab, "title": f"sentence {i + 1}"}
                         for i, (w, lab) in enumerate(zip(maps2d, labels))], title=title)


def heatmap_grid(panels: list[dict], ncols: int | None = None, title: str | None = None,
                 shared_scale: bool = False, cells: Cells = WEIGHTS) -> Figure:
    """Several attention maps side by side, each drawn by :func:`plot_heatmap`, no wider than the
    report's page, so the numbers in the cells are read at the size they are drawn.

    ``panels``: dicts with ``weights`` [Tq, Tk], ``rows`` and ``cols`` (labels), ``title`` and
    optionally ``highlight`` (row indices to frame). ``shared_scale``: one colour scale for all, 0
    to 1 (signed ``cells``: −m to m, m the largest magnitude of any panel).
    """
    from matplotlib.figure import Figure

    if not panels:
        raise ValueError("panels is empty; give at least one map")
    ncols = ncols or len(panels)
    nrows = -(-len(panels) // ncols)
    bar, shared_bar = (0, 0.9) if shared_scale else (0.9, 0)  # inches of colour scale per panel / for all
    side = max(3.2, CELL_INCHES * max(max(np.shape(p["weights"])) for p in panels) + 1.6)
    side = min(side, (PAGE_INCHES - shared_bar) / ncols - bar)
    # a wide map (heads down, positions across) is drawn with square cells: its row of panels only as tall as
    # the map, its title and its labels, not as tall as wide (rows of blank space between the layers)
    aspect = max(np.shape(p["weights"])[0] / max(1, np.shape(p["weights"])[1]) for p in panels)
    height = min(side, (side - 0.6) * aspect + LABEL_INCHES)
    fig = Figure(figsize=(ncols * (side + bar) + shared_bar, nrows * height + (0.4 if title else 0)),
                 layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).ravel()
    vmax = (max(float(np.abs(p["weights"]).max()) for p in panels) if cells.signed else 1.0) if shared_scale else None
    for ax, p in zip(axes, panels):
        # a title as wide as its panel, wrapped (a role's long description was cut at both ends: "narks ([CLS]…")
        title_lines = wrap_title(p["title"], max(20, int(side * TITLE_CHARS_PER_INCH)))
        plot_heatmap(p["weights"], p["rows"], p["cols"], title=title_lines, ax=ax, highlight_rows=tuple(p.get("highlight", ())),
                     vmax=vmax, colorbar=not shared_scale, cells=cells)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if shared_scale:
        percent_bar(fig.colorbar(axes[0].images[0], ax=list(axes), shrink=0.6, label=cells.value))
    if title:
        fig.suptitle(title)
    return fig
