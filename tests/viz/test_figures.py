"""The lesson's figures read at the report's size: labels that do not overlap, the word a figure is
about marked, cell numbers large enough and inside their cells. Measured on the drawn figure
(matplotlib's own text extents at the report's dpi), no model needed."""

from __future__ import annotations

import numpy as np
import pytest

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from attnlab.lesson.heads import heads_section  # noqa: E402
from attnlab.lesson.report import DPI  # noqa: E402
from attnlab.viz import figures  # noqa: E402

PAGE_PX = 1150  # the report page's width (report.py's CSS)
MIN_TEXT_PX = 10  # cell numbers at least this tall, as drawn on the page


def drawn(fig):
    fig.set_dpi(DPI)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("model_id", ["sentence-transformers/all-MiniLM-L6-v2", "an-organisation/a-rather-long-model-name-v2"])
def test_head_costs_x_labels_do_not_overlap(model_id):
    data = heads_section({"model_id": model_id, "num_layers": 6, "num_heads": 12, "hidden_size": 384}).data
    fig = figures.head_costs(data)
    renderer = drawn(fig)
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert len(boxes) == 4
    assert not any(overlaps(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def maps_data(words_per_sentence, seed=0) -> dict:
    """A section-5 data dict of random maps: two "bank" maps and three role maps, as realmaps makes."""
    rng = np.random.default_rng(seed)
    heatmaps = []
    for s, words in enumerate(words_per_sentence):
        w = rng.dirichlet(np.ones(len(words)), size=len(words))
        heatmaps.append({"title": '"bank" head, the closest head: layer 1, head 1', "sentence": s, "words": words,
                         "weights": w.tolist()})
    for role in ("previous word", "next word", "marks"):
        words = words_per_sentence[0]
        w = rng.dirichlet(np.ones(len(words)) * 0.1, size=len(words))
        heatmaps.append({"title": f"{role}: layer 2, head 3, average 90 %", "sentence": 0, "words": words, "weights": w.tolist()})
    return {"target": "bank", "heatmaps": heatmaps}


SENTENCES = [["[CLS]", "I", "sat", "on", "the", "bank", "of", "the", "river", ".", "[SEP]"],
             ["[CLS]", "I", "put", "the", "money", "in", "the", "bank", ".", "[SEP]"]]


def test_bank_head_frames_the_bank_row_in_each_sentence():
    fig = figures.bank_head(maps_data(SENTENCES))
    drawn(fig)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 2
    for ax, words in zip(panels, SENTENCES):
        row = words.index("bank")
        frames = [p for p in ax.patches if p.get_gid() == "highlight"]
        assert len(frames) == 1
        (x0, y0), (x1, y1) = frames[0].get_bbox().get_points()
        assert (y0, y1) == (row - 0.5, row + 0.5) and (x0, x1) == (-0.5, len(words) - 0.5)
        label = ax.get_yticklabels()[row]
        assert label.get_text() == "bank" and label.get_fontweight() == "bold"
        assert all(t.get_fontweight() != "bold" for i, t in enumerate(ax.get_yticklabels()) if i != row)


@pytest.mark.parametrize("draw", ["role_heads", "bank_head"])
def test_cell_numbers_are_readable_at_page_size(draw):
    fig = getattr(figures, draw)(maps_data(SENTENCES))
    renderer = drawn(fig)
    width_px = fig.get_figwidth() * DPI
    assert width_px <= PAGE_PX + 1  # not shrunk by the page, so drawn sizes are the sizes read
    for ax in (a for a in fig.axes if a.images):
        cells = [t for t in ax.texts if t.get_gid() == "cell"]
        n_rows, n_cols = np.shape(ax.images[0].get_array())
        assert len(cells) == n_rows * n_cols
        box = ax.get_window_extent(renderer)
        cell_w, cell_h = box.width / n_cols, box.height / n_rows
        for t in cells:
            ext = t.get_window_extent(renderer)
            assert ext.height >= MIN_TEXT_PX
            assert ext.width <= cell_w and ext.height <= cell_h  # "100" fits its cell
