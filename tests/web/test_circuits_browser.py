"""The model view coloured by a circuit tool, in a real browser (headless Debian Chromium via Playwright):
texts and tokens typed in the page, the heads' values are the library's (attnlab.patch and
attnlab.logit_attribution called here, with a metric written here) and each head's colour is the
red-white-blue ramp of its value over the largest magnitude, recomputed here; an encoder's viewer
shows the form disabled with the reason."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

import attnlab

pytestmark = [pytest.mark.browser, pytest.mark.needs("torch", "transformers", "fastapi")]
# ATTNLAB_SCREENSHOT_DIR=docs/viewer keeps the picture (docs/viewer/model-patching.png)
SHOTS = Path(os.environ["ATTNLAB_SCREENSHOT_DIR"]) if os.environ.get("ATTNLAB_SCREENSHOT_DIR") else None
CLEAN, CORRUPTED, TARGET, BASELINE = "Set the class of the", "Set the file of the", " class", " file"
BLUE, RED = (44, 111, 187), (192, 57, 43)  # the viewer's --blue and --accent


@pytest.fixture(scope="module")
def decoder_server(serve):
    from attnlab.web.server import create_app

    with serve(create_app("attnlab:decoder")) as url:
        yield url


def ramp(x: float) -> tuple[int, ...]:
    """The colour of x in [-1, 1]: white at 0, linear in |x| to blue above and red below (JS Math.round)."""
    end = RED if x < 0 else BLUE
    return tuple(math.floor(255 + (c - 255) * abs(x) + 0.5) for c in end)


def ids(decoder, text: str):
    import torch

    return torch.tensor([decoder.tokenizer(text)["input_ids"]])


def one_id(decoder, text: str) -> int:
    (i,) = decoder.tokenizer(text, add_special_tokens=False)["input_ids"]
    return i


def colour(page, kind: str, text: str, corrupted: str | None = None) -> np.ndarray:
    """Type the texts and tokens as a person does, press Colour; the heads' values as the page holds them, [L, H],
    after checking each cell's colour against its value."""
    page.select_option("#circuit-kind", kind)
    page.fill("#circuit-clean", text)
    if corrupted is not None:
        page.fill("#circuit-corrupted", corrupted)
    page.fill("#circuit-target", TARGET)
    page.fill("#circuit-baseline", BASELINE)
    page.click("#circuit-run")
    page.wait_for_function("(k) => { const c = window.attnlab.model.colour(); return c && c.kind === k; }", arg=kind)
    page.wait_for_selector("#model-grid .cell.coloured")
    cells = page.eval_on_selector_all("#model-grid .cell", "cs => cs.map((c) => [Number(c.dataset.layer), Number("
                                      "c.dataset.head), Number(c.dataset.value), getComputedStyle(c).backgroundColor])")
    L, H = max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1
    values = np.zeros((L, H))
    for layer, head, value, background in cells:
        values[layer, head] = value
    top = np.abs(values).max()
    for layer, head, value, background in cells:
        got = tuple(int(x) for x in re.findall(r"\d+", background)[:3])
        assert got == ramp(value / top), (layer, head, value, background)
    return values


def test_the_model_view_colours_its_heads_by_patching_and_by_attribution(page, decoder, decoder_server, tmp_path):
    page.goto(decoder_server + "/#model")
    page.wait_for_selector("#model-grid .cell")
    page.wait_for_selector("#circuit-run:not([disabled])")
    t, b = one_id(decoder, TARGET), one_id(decoder, BASELINE)
    metric = lambda logits: logits[:, -1, t] - logits[:, -1, b]  # noqa: E731

    want = attnlab.patch(decoder, ids(decoder, CLEAN), ids(decoder, CORRUPTED), metric).effect
    got = colour(page, "patch", CLEAN, CORRUPTED)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # one text drives both: the small maps are the clean text's, which the page's sentence box now holds
    assert page.input_value("#sentence-a") == CLEAN
    assert page.evaluate("() => document.querySelector('#view-model').textContent").count("layers ×") == 1
    best = np.unravel_index(want.argmax(), want.shape)
    cell = page.locator(f'#model-grid .cell[data-layer="{best[0]}"][data-head="{best[1]}"]')
    assert cell.locator(".value").inner_text() == f"{want[best]:.2f}"
    assert "restores" in page.inner_text("#circuit-legend")
    page.screenshot(path=str((SHOTS or tmp_path) / "model-patching.png"), full_page=True)

    attribution = attnlab.logit_attribution(decoder, ids(decoder, CLEAN), t, baseline=b)
    heads = {c: v for c, v in zip(attribution.components, attribution.values) if isinstance(c, attnlab.Head)}
    want = np.array([[heads[attnlab.Head(l, h)] for h in range(4)] for l in range(4)])
    np.testing.assert_allclose(colour(page, "attribute", CLEAN), want, rtol=0, atol=1e-12)
    assert not page.is_visible("#circuit-corrupted")  # attribution reads one text
    assert (want < 0).any()  # both ends of the ramp were checked
    page.screenshot(path=str(tmp_path / "model-attribution.png"), full_page=True)
    page.click("#circuit-clear")
    assert page.locator("#model-grid .cell.coloured").count() == 0


def test_a_token_that_is_not_one_is_said_in_the_form(page, decoder_server):
    page.goto(decoder_server + "/#model")
    page.wait_for_selector("#circuit-run:not([disabled])")
    colour(page, "attribute", CLEAN)
    page.select_option("#circuit-kind", "patch")  # the form now says another tool: the old colours go
    assert page.locator("#model-grid .cell.coloured").count() == 0
    page.fill("#circuit-target", " Paris")
    page.click("#circuit-run")
    page.wait_for_selector("#circuit-status.error")
    assert "target must be one token, got ' Paris', which is 3 tokens" in page.inner_text("#circuit-status")
    assert page.locator("#model-grid .cell.coloured").count() == 0  # and an error leaves none


def test_an_encoders_viewer_shows_the_form_disabled_with_the_reason(page, live_server):
    page.goto(live_server + "/#model")
    page.wait_for_selector("#circuit-status:has-text('encoder')")
    assert page.is_disabled("#circuit-run") and page.is_disabled("#circuit-clean")
    assert "no next-token logits" in page.inner_text("#circuit-status")
