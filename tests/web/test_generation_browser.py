"""The Generation view in a real browser (headless Debian Chromium via Playwright): a page written with
the steps of a generation draws, for the step on the slider and the head chosen, the library's row
(lines and heat); the viewer of an encoder shows the view disabled, with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from attnlab.viz.generation import steps_payload
from attnlab.viz.page import write_generation_html
from generation_steps import recomputed

pytestmark = [pytest.mark.browser, pytest.mark.needs("torch", "transformers")]
# ATTNLAB_SCREENSHOT_DIR=docs/viewer keeps the pictures (docs/viewer/generation.png)
SHOTS = Path(os.environ["ATTNLAB_SCREENSHOT_DIR"]) if os.environ.get("ATTNLAB_SCREENSHOT_DIR") else None


@pytest.fixture(scope="module")
def steps(decoder):
    return recomputed(decoder, decoder.tokenizer("Return the number of items in")["input_ids"], 8)


def choose(page, step: int, layer: int, head: int) -> None:
    """Step, layer and head as a person picks them (1-based)."""
    page.locator("#gen-step").fill(str(step))
    page.select_option("#gen-layer", str(layer))
    page.select_option("#gen-head", str(head))


def check_lines(page, want: np.ndarray, step: int, layer: int, head: int) -> None:
    page.wait_for_function("([n, s, l, h]) => { const c = window.attnlab.generation.state();"
                           " return c.step === s - 1 && c.layer === l && c.head === h"
                           " && window.attnlab.generation.drawn().length === n; }", arg=[len(want), step, layer, head])
    drawn = np.array(page.evaluate("() => window.attnlab.generation.drawn()"))
    np.testing.assert_array_equal(drawn[:, 0], np.arange(len(want)))
    np.testing.assert_allclose(drawn[:, 1], want, atol=6e-6)
    top = page.locator("#gen-row li").first
    assert top.get_attribute("data-index") == str(int(want.argmax()))
    assert abs(float(top.locator(".pct").inner_text().rstrip(" %")) - 100 * want.max()) <= 0.051


def test_page_draws_the_rows_of_the_step_and_head_chosen(page, decoder, steps, tmp_path):
    path = write_generation_html(steps_payload(decoder, steps, "attnlab:decoder"), tmp_path / "gen")
    page.goto(path.as_uri())
    page.wait_for_selector("#gen-lines")
    assert page.is_visible('#tabs button[data-view="generation"]')
    assert not page.is_visible('#tabs button[data-view="head"]') and not page.is_visible("#gen-form")
    P = steps.prompt_lengths[0]
    for step, layer, head in ((1, 1, 1), (5, 3, 2), (8, 4, 4)):
        choose(page, step, layer, head)
        want = steps.attention[0][step - 1][layer - 1, head - 1]
        assert page.inner_text("#gen-caption").startswith(f"attnlab:decoder: layer {layer}, head {head}. Step {step}:")
        assert page.locator("#gen-tokens .chosen").get_attribute("data-index") == str(P - 2 + step)
        check_lines(page, want, step, layer, head)
    page.select_option("#gen-display", "heat")
    page.wait_for_selector("#gen-heat")
    t, j = 7, int(want.argmax())
    pixel = page.evaluate("([i, j]) => Array.from(document.querySelector('#gen-heat').getContext('2d')"
                          ".getImageData(j, i, 1, 1).data.slice(0, 3))", [t, j])
    ramp = page.evaluate("(w) => window.attnlab.heatRGB(w)", float(want[j]))
    assert max(abs(a - b) for a, b in zip(pixel, ramp)) <= 1
    page.screenshot(path=str((SHOTS or tmp_path) / "generation-heat.png"), full_page=True)


def test_an_encoders_viewer_shows_the_view_disabled_with_the_reason(page, live_server):
    page.goto(live_server + "/#generation")
    page.wait_for_selector("#gen-status:has-text('encoder')")
    assert page.is_disabled("#gen-run") and page.is_disabled("#gen-prompt")
    assert "does not generate" in page.inner_text("#gen-status")


@pytest.fixture(scope="module")
def decoder_server(serve):
    from attnlab.web.server import create_app

    with serve(create_app("attnlab:decoder")) as url:
        yield url


def test_served_view_generates_and_draws_the_librarys_rows(page, decoder, decoder_server, tmp_path):
    prompt = "Return the number of items in"
    want = recomputed(decoder, decoder.tokenizer(prompt)["input_ids"], 12)
    page.goto(decoder_server + "/#generation")
    page.wait_for_selector("#gen-run:not([disabled])")
    page.fill("#gen-prompt", prompt)
    page.fill("#gen-n", "12")
    assert page.inner_text("#gen-run") == "Generate 12 tokens"
    page.click("#gen-run")
    page.wait_for_selector("#gen-lines")
    labels = page.locator("#gen-tokens .gen-token").all_inner_texts()
    P = want.prompt_lengths[0]
    assert len(labels) == P + 12 and "".join(labels[P:]).replace("␣", " ") == want.text[0].replace("\n", "↵")
    choose(page, 9, 2, 3)
    check_lines(page, want.attention[0][8][1, 2], 9, 2, 3)
    page.screenshot(path=str((SHOTS or tmp_path) / "generation.png"), full_page=True)
