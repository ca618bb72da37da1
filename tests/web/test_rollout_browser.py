"""The Rollout view in a real browser (headless Debian Chromium via Playwright): served by uvicorn on
127.0.0.1 and as a self-contained page from a file, a drawn cell of the map and the chosen row's bars
equal attnlab.rollout's (and attnlab.flow's) value at the layer chosen."""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab.analysis.rollout import flow_one  # attnlab.flow of one sentence
from attnlab.viz.rollout_view import FLOW_MAX_POSITIONS

pytestmark = pytest.mark.browser

SENTENCE = "I sat on the bank of the river."


def pct1(x: float) -> str:
    return f"{100 * x:.1f} %"


def drawn(page, i: int, j: int) -> dict:
    """The colour of cell (i, j) of the map (its canvas has a pixel per cell), the colour the view's
    ramp gives the expected weight, and the weights the view holds."""
    return page.evaluate("""([i, j]) => {
        const c = document.querySelector('#rollout-heat');
        return {pixel: Array.from(c.getContext('2d').getImageData(j, i, 1, 1).data.slice(0, 3)),
                size: [c.width, c.height], current: window.attnlab.rollout.current()};
    }""", [i, j])


def check_view(page, want: np.ndarray, row: int, atol: float) -> None:
    """The map drawn, the view's weights and the bars of ``row`` against ``want`` [T, T]."""
    n = want.shape[-1]
    page.click(f'#rollout-words .word[data-index="{row}"]')
    page.wait_for_selector("#rollout-row")
    got = drawn(page, row, int(want[row].argmax()))
    assert got["size"] == [n, n]
    np.testing.assert_allclose(np.array(got["current"]["weights"]).reshape(n, n), want, atol=atol)
    ramp = page.evaluate("(w) => window.attnlab.heatRGB(w)", float(want[row].max()))
    assert max(abs(a - b) for a, b in zip(got["pixel"], ramp)) <= 1
    bars = page.locator("#rollout-row tr")
    assert bars.count() == n
    for j in range(n):
        text = bars.nth(j).locator(".pct").inner_text()
        assert abs(float(text.rstrip(" %")) - 100 * want[row, j]) <= 0.05 + 100 * atol, (j, text)


def test_served_rollout_tab_draws_the_librarys_rollout_and_flow(page, live_server, default_model):
    maps = attnlab.capture([SENTENCE], default_model).to_words()
    page.goto(live_server + "/#rollout")
    assert page.is_visible('#tabs button[data-view="rollout"]') and page.is_visible("#input")
    page.wait_for_selector("#rollout-heat")
    labels = page.locator("#rollout-words .word").all_inner_texts()
    assert labels == maps.words[0]  # the form's default sentence is the first bank sentence
    assert page.input_value("#rollout-layer") == "6"  # through every layer at first
    page.select_option("#rollout-layer", "3")
    page.select_option("#rollout-residual", "0.3")
    page.wait_for_selector("#rollout-caption:has-text('layers 1–3 of 6, residual 0.3')")
    page.wait_for_selector("#rollout-heat")
    bank = labels.index("bank")
    check_view(page, attnlab.rollout(maps, 0.3)[0][2], bank, atol=2e-6)

    page.select_option("#rollout-method", "flow")
    page.wait_for_selector("#rollout-caption:has-text('attention flow through layers 1–3')")
    page.wait_for_selector("#rollout-heat", timeout=60_000)
    check_view(page, flow_one(maps.weights[0], 0.3, 2), bank, atol=2e-6)


def test_flow_is_not_offered_for_a_long_sentence_and_the_panel_says_why(page, live_server):
    sentence = " ".join(["word"] * FLOW_MAX_POSITIONS)  # and [CLS], [SEP]: over the limit
    page.goto(live_server + "/#rollout")
    page.wait_for_selector("#rollout-heat")
    page.fill("#sentence-a", sentence)
    page.click("#run")
    page.wait_for_selector(f"#rollout-flow-note:has-text('has {FLOW_MAX_POSITIONS + 2} words')")
    assert page.is_disabled('#rollout-method option[value="flow"]')
    assert f"up to {FLOW_MAX_POSITIONS} positions" in page.inner_text("#rollout-flow-note")
    page.wait_for_selector("#rollout-heat")


def test_page_rollout_tab_from_a_file(page, bank_maps, tmp_path):
    from attnlab.viz.page import write_maps_html

    maps = bank_maps.to_words()
    path = write_maps_html(maps, tmp_path / "bank.html")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri() + "#rollout")
    page.wait_for_selector("#rollout-heat")
    assert page.is_hidden("#input") and page.is_disabled("#rollout-residual")
    assert "residual 0.5 only" in page.inner_text("#rollout-page-note")
    page.select_option("#rollout-sentence", "1")
    page.select_option("#rollout-layer", "2")
    page.wait_for_selector("#rollout-caption:has-text('layers 1–2 of 6, residual 0.5')")
    page.wait_for_selector("#rollout-heat")
    bank = maps.words[1].index("bank")
    check_view(page, attnlab.rollout(maps, 0.5)[1][1], bank, atol=1 / 65535)

    page.select_option("#rollout-method", "flow")  # the page holds flow through all layers only
    page.wait_for_selector("#rollout-unavailable:has-text('choose layer 6')")
    page.select_option("#rollout-layer", "6")
    page.wait_for_selector("#rollout-heat")
    check_view(page, flow_one(maps.weights[1], 0.5), bank, atol=1 / 65535)
    assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests
