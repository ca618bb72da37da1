"""The patching heat map: the one heat-map grid on a diverging scale symmetric about 0, layers and heads
1-based on the axes, the effect in percent in the cells; per position, one panel per layer on one scale."""

import numpy as np
import pytest

from attnlab.viz.patching import EFFECT, patching_figure


def test_a_head_grid_is_one_panel_on_a_scale_symmetric_about_zero(tmp_path):
    effect = np.array([[0.42, -0.1, 0.0], [0.05, 0.2, -0.3]])  # [L, H] = 2 x 3
    fig = patching_figure(effect, "m: each head patched")
    ax = fig.axes[0]
    image = ax.images[0]
    assert image.get_cmap().name == "RdBu" and image.get_clim() == (-0.42, 0.42)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3"]
    assert (ax.get_ylabel(), ax.get_xlabel()) == ("layer", "head")
    assert [t.get_text() for t in ax.texts] == ["42", "-10", "0", "5", "20", "-30"]
    assert fig.axes[1].get_ylabel() == EFFECT  # the colour bar
    fig.savefig(tmp_path / "p.png")
    ticks = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert "−40%" in ticks and "40%" in ticks  # in percent, as the cells (not -0.4 beside a cell's -40)


def test_per_position_is_a_panel_per_layer_on_one_scale():
    effect = np.zeros((3, 2, 4))
    effect[2, 1, 3], effect[0, 0, 0] = 0.8, -0.5
    fig = patching_figure(effect, "m", tokens=["a", "b", "c", "d"])
    panels = [a for a in fig.axes if a.get_title().startswith("layer")]
    assert [a.get_title() for a in panels] == ["layer 1", "layer 2", "layer 3"]
    assert {a.images[0].get_clim() for a in panels} == {(-0.8, 0.8)}
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["a", "b", "c", "d"]


def test_bad_shapes_and_tokens():
    with pytest.raises(ValueError, match=r"effect must be \[L, H\] or \[L, H, T\], got shape \(2,\)"):
        patching_figure(np.ones(2), "m")
    with pytest.raises(ValueError, match="tokens must name the 4 positions"):
        patching_figure(np.ones((1, 1, 4)), "m", tokens=["a"])
