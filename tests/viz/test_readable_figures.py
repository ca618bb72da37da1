"""Figures a reader can read at their default size: titles and legends inside the figure, legends apart
from each other and off the axes they explain, titles broken where they read, colour bars in whole percent."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnlab.viz.heatmap import heatmap_grid, wrap_title

LONG_MACHINE = "this machine (AMD EPYC 7B13 64-Core Processor, 2 torch threads)"


def _boxes(fig):
    """Every axes title and legend of ``fig`` as drawn, in pixels, and the figure's own box."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    titles = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    if fig._suptitle is not None:  # matplotlib keeps the figure's title there (no public getter of the Text)
        titles.append(fig._suptitle.get_window_extent(renderer))
    legends = [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend()]
    return titles, legends, fig.bbox, [ax.get_window_extent(renderer) for ax in fig.axes]


def _inside(box, frame, slack=1.0):
    return box.x0 >= frame.x0 - slack and box.x1 <= frame.x1 + slack and box.y0 >= frame.y0 - slack and \
        box.y1 <= frame.y1 + slack


def _check_readable(fig):
    titles, legends, frame, axes = _boxes(fig)
    assert titles and legends
    for box in titles + legends:
        assert _inside(box, frame), (box, frame)  # nothing cut at the figure's edge
    for i, a in enumerate(legends):
        assert not any(a.overlaps(b) for b in legends[i + 1:])  # no legend over another
        assert not any(a.overlaps(ax) for ax in axes)  # nor over a curve, a budget line or a point


@pytest.fixture(scope="module")
def serving():
    from attnlab.planner import plan

    plans, curves = {}, {}
    for where in ("l4", "h100"):  # l4: memory sets the largest prompt; h100: the model's positions do (the long label)
        plans[where] = plan("llama-3.1-8b", where, prompt_tokens=[8000, 32000], new_tokens=256).to_dict()
        curves[where] = plan("llama-3.1-8b", where, prompt_tokens=[1000 * 2**k for k in range(8)],
                             new_tokens=256).to_dict()
    curves["l4"]["hardware"]["name"] = LONG_MACHINE  # as long as this machine's name gets
    return {"serving": {"plans": plans, "curves": curves}}


def test_the_lessons_serving_figure_keeps_its_titles_and_legends_inside_and_apart(serving):
    from attnlab.viz.planplot import serving_figure

    assert serving["serving"]["curves"]["h100"]["search"]["capped"]  # the longest legend entry is drawn
    _check_readable(serving_figure(serving))


def test_the_plan_figure_keeps_its_legends_inside_and_apart(serving):
    from attnlab.viz.planplot import plan_figure

    for where in ("l4", "h100"):
        _check_readable(plan_figure(serving["serving"]["curves"][where], serving["serving"]["plans"][where]))


def test_a_long_panel_title_breaks_after_its_lead_and_keeps_numbers_with_their_percent():
    title = "marks ([CLS], [SEP], punctuation): layer 3, head 10, average 94 %"
    assert wrap_title(title, 40) == "marks ([CLS], [SEP], punctuation):\nlayer 3, head 10, average 94\u00a0%"
    assert wrap_title("previous word: layer 1, head 3, average 100 %", 60) == \
        "previous word: layer 1, head 3, average 100\u00a0%"  # short enough: one line


def test_colour_bars_read_whole_percent_as_the_cells_do():
    w = np.array([[0.35, 0.65], [0.1, 0.9]])
    fig = heatmap_grid([{"weights": w, "rows": ["a", "b"], "cols": ["a", "b"], "title": "t"}])
    FigureCanvasAgg(fig).draw()
    bar = fig.axes[-1]
    ticks = [t.get_text() for t in bar.get_yticklabels() if t.get_text()]
    assert ticks and all(t.endswith("%") and ".0%" not in t for t in ticks), ticks


def test_kv_labels_stay_inside_the_axes_and_apart():
    """attnlab kv's points: four settings of one size at the left end (their labels ran over the KL axis'
    numbers, and two nearly equal KLs put one label on the other), others in the middle and at the right."""
    from attnlab.viz.kvplot import kv_figure

    def row(name, cache, size, kl, pareto=False):
        return {"name": name, "setting": {"cache": cache} if cache else {}, "bytes_per_token": size, "kl_mean": kl,
                "pareto": pareto}

    rows = [row("knorm 32 float32", "knorm", 512.0, 1.5), row("random 32 float32", "random", 512.0, 0.95),
            row("h2o 32 float32", "h2o", 512.0, 0.050, True), row("snapkv 32 float32", "snapkv", 512.0, 0.045),
            row("dense fp8", None, 512.0, 6e-4, True), row("h2o 64 float32", "h2o", 1024.0, 0.011),
            row("snapkv 64 float32", "snapkv", 1024.0, 0.010), row("dense float32", None, 2048.0, 1e-12, True),
            row("dense int4", None, 2437.0, 1e-12)]
    fig = kv_figure({"model": "attnlab:decoder", "prompt_tokens": 96, "scored_tokens": 32, "rows": rows})
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    frame = ax.get_window_extent(renderer)
    labels = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(labels) == len(rows)
    for box in labels:
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (box, frame)  # not over the axis' numbers, nor cut
    for i, a in enumerate(labels):
        assert not any(a.overlaps(b) for b in labels[i + 1:])
