"""Heatmaps: tokens on both axes, percentages in the cells, clear errors."""

import numpy as np
import pytest

from attnlab.viz.heatmap import plot_heatmap, plot_maps


def test_heatmap_labels_and_cells(tmp_path):
    w = np.array([[0.9, 0.1], [0.25, 0.75]])
    fig = plot_heatmap(w, ["bank", "river"], ["bank", "river"], title="layer 1, head 1")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["bank", "river"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["bank", "river"]
    assert sorted(t.get_text() for t in ax.texts) == ["10", "25", "75", "90"]
    assert ax.get_title() == "layer 1, head 1"
    fig.savefig(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000


def test_several_sentences_side_by_side():
    fig = plot_maps([np.eye(2), np.eye(3)], [["a", "b"], ["x", "y", "z"]], title="t")
    assert len([a for a in fig.axes if a.get_title().startswith("sentence")]) == 2


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"2 row labels"):
        plot_heatmap(np.eye(3), ["a", "b"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="must be 2-D"):
        plot_heatmap(np.ones((1, 2, 2)), ["a"], ["a"])
