"""The sink share in the page (headless Debian Chromium via Playwright), of a tiny random gpt-oss: the head
view's "sink" chip and the chosen row's share as a number; the Neuron view's weights recomputed with the
head's learned sink equal capture's."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.needs("torch", "transformers")]

SENTENCE = "I sat on the bank of the river."
SHOTS = Path(os.environ["ATTNLAB_SCREENSHOT_DIR"]) if os.environ.get("ATTNLAB_SCREENSHOT_DIR") else None


def pct1(x: float) -> str:
    return f"{100 * x:.1f} %"


def test_head_and_neuron_views_show_the_sink_share(page, tiny_folder, tmp_path):
    from attnlab.hf.capture import capture
    from attnlab.viz.page import write_maps_html

    maps = capture([SENTENCE], str(tiny_folder("gpt_oss")), qk=True)
    page.goto(write_maps_html(maps, tmp_path / "oss.html").as_uri() + "#head")
    page.wait_for_selector("#head-words .word")
    layer, head, query = 2, 3, 4
    page.select_option("#head-layer", str(layer))
    page.select_option("#head-head", str(head))
    page.wait_for_selector(f"#head-caption:has-text('layer {layer}, head {head}')")
    page.wait_for_selector("#head-sink-chip")
    page.click(f'#head-words .word[data-index="{query}"]')
    share = float(maps.self_attention.sink_share[0][layer - 1, head - 1, query])
    packed = round(share * 65535) / 65535  # the page's copy, packed as the weights are
    assert page.inner_text("#head-sink") == f"the learned sink takes {pct1(packed)}: the weights add up to {pct1(1 - packed)}"
    assert page.get_attribute("#head-sink-chip", "title") == f"the learned sink takes {pct1(packed)} of this row"
    assert page.eval_on_selector("#head-sink-chip", "c => c.style.background") != ""
    page.screenshot(path=str((SHOTS or tmp_path) / "head-sink.png"), full_page=True)
    page.click('#tabs button[data-view="neuron"]')
    page.wait_for_selector("#view-neuron table.neuron")
    page.select_option("#view-neuron select[aria-label=layer]", str(layer))
    page.select_option("#view-neuron select[aria-label=head]", str(head))
    page.wait_for_selector(f"#neuron-step:has-text('layer {layer}, head {head};')")
    page.locator("#view-neuron .controls button").last.click()
    assert "learned sink" in page.inner_text("#neuron-step")
    got = page.evaluate("(() => { const c = window.attnlab.neuron.current(); return window.attnlab.neuronRow("
                        f"c.q[c.query], c.k, c.query, c.meta, null, c.meta.sink_logits[{head - 1}]); }})()")
    last = len(maps.tokens[0]) - 1  # the Neuron view's query: the sentence's last token
    np.testing.assert_allclose(got["weights"], maps.weights[0][layer - 1, head - 1, last], atol=1e-5)
    assert got["sink"] == pytest.approx(float(maps.self_attention.sink_share[0][layer - 1, head - 1, last]), abs=1e-5)
    assert "takes" in page.inner_text("#neuron-sink")
    page.screenshot(path=str((SHOTS or tmp_path) / "neuron-sink.png"), full_page=True)
