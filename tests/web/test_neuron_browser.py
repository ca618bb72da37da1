"""The Neuron view of `attnlab serve`'s page in a real browser (headless Debian Chromium via
Playwright, uvicorn on 127.0.0.1): q, each k and q∘k as bars, q·k, the scaled score and the weight
of a chosen word, the weight equal to the head view's and to the model's captured map."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.browser

SENTENCE = "I sat on the bank of the river."  # no word split into pieces: tokens and words alike
SHOTS = Path(os.environ["ATTNLAB_SCREENSHOT_DIR"]) if os.environ.get("ATTNLAB_SCREENSHOT_DIR") else None


def pct1(x: float) -> str:
    return f"{100 * x:.1f} %"


def shot(page, tmp_path, name: str) -> None:
    page.screenshot(path=str((SHOTS or tmp_path) / name), full_page=True)


def test_server_neuron_view_builds_the_head_views_weight(page, live_server, client, default_model, tmp_path):
    from attnlab.hf.capture import capture

    layer, head = 3, 11
    page.goto(live_server + "/#neuron")
    assert page.is_visible('#tabs button[data-view="neuron"]') and page.is_visible("#input")
    page.wait_for_selector("#view-neuron table.neuron")
    page.select_option("#view-neuron select[aria-label=layer]", str(layer))
    page.select_option("#view-neuron select[aria-label=head]", str(head))
    page.wait_for_selector(f"#neuron-step:has-text('layer {layer}, head {head};')")
    tokens = page.locator("#view-neuron .strip .word").all_inner_texts()
    bank = tokens.index("bank")
    page.click(f'#view-neuron .strip .word[data-index="{bank}"]')
    page.wait_for_selector("#neuron-query:has-text('q(bank)')")
    steps = page.locator("#view-neuron .controls button")
    assert steps.count() == 4  # no position bias in a BERT: q and k, scores, softmax, blend
    steps.nth(3).click()
    page.wait_for_selector("#neuron-step:has-text('Step 4')")

    table = page.locator("#view-neuron table.neuron")
    assert table.locator("thead th").all_inner_texts()[:5] == ["key", "k", "q∘k", "q·k", f"× {32 ** -0.5:.3g}"]
    assert table.locator("tbody tr").count() == len(tokens)
    assert table.locator("tbody tr").first.locator("canvas.vec").count() == 2  # k and q∘k as colour bars
    assert page.locator("#view-neuron p canvas.vec").count() == 1  # q
    dots = [float(t) for t in table.locator("td.dot").all_inner_texts()]
    scaled = [float(t) for t in table.locator("td.scaled").all_inner_texts()]
    weights = table.locator("td.weight").all_inner_texts()

    api = client.post("/api/neuron", json={"sentences": [SENTENCE], "layer": layer - 1, "head": head - 1}).json()  # 0-based
    q, k = np.array(api["q"]), np.array(api["k"])
    np.testing.assert_allclose(dots, k @ q[bank], atol=0.006)  # as printed, 2 decimals
    np.testing.assert_allclose(scaled, k @ q[bank] * api["meta"]["scale"], atol=0.006)
    want = capture([SENTENCE], default_model).weights[0][layer - 1, head - 1, bank]
    assert weights == [pct1(w) for w in want]
    exact = page.evaluate("(() => { const c = window.attnlab.neuron.current();"
                          " return window.attnlab.neuronRow(c.q[c.query], c.k, c.query, c.meta, null).weights; })()")
    np.testing.assert_allclose(exact, want, atol=1e-5)
    shot(page, tmp_path, "neuron-server.png")

    # The head view of the same head and word shows the same weights.
    page.click('#tabs button[data-view="head"]')
    page.select_option("#level", "token")
    page.wait_for_selector("#head-words .word")
    page.select_option("#head-layer", str(layer))
    page.select_option("#head-head", str(head))
    page.wait_for_selector(f"#head-caption:has-text('layer {layer}, head {head}')")
    page.wait_for_selector("#head-lines")
    page.click(f'#head-words .word[data-index="{bank}"]')
    listed = [(int(li.get_attribute("data-index")), li.locator(".pct").inner_text()) for li in page.locator("#head-row li").all()]
    assert listed and all(weights[j] == text for j, text in listed)


def test_server_neuron_view_follows_new_sentences(page, live_server):
    page.goto(live_server + "/#neuron")
    page.wait_for_selector("#view-neuron table.neuron")
    page.fill("#sentence-a", "The river runs past the bank.")
    page.fill("#sentence-b", "I put the money in the bank.")
    page.click("#run")
    page.wait_for_selector("#view-neuron select[aria-label=sentence]")
    page.select_option("#view-neuron select[aria-label=sentence]", "1")
    page.wait_for_function("[...document.querySelectorAll('#view-neuron .strip .word')].some((w) => w.textContent === 'money')")
    assert page.locator("#view-neuron .strip .word.chosen").inner_text() == "[SEP]"  # the last token, at first
