"""`attnlab serve` of an encoder–decoder (a tiny T5) in a real browser (headless Debian Chromium via
Playwright): the form takes a source and a target, and the head view's cross choice shows the
target's tokens and the source's side by side with the API's cross-attention weights."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.needs("torch", "transformers", "fastapi")]

SOURCE, TARGET = "I sat on the bank of the river.", "The river runs past the bank, slowly!"
SHOTS = Path(os.environ["ATTNLAB_SCREENSHOT_DIR"]) if os.environ.get("ATTNLAB_SCREENSHOT_DIR") else None


@pytest.fixture(scope="module")
def t5_server(seq2seq_app, serve):
    with serve(seq2seq_app) as url:
        yield url


def pct1(x: float) -> str:
    return f"{100 * x:.1f} %"


def test_served_encoder_decoder_shows_cross_attention_side_by_side(page, t5_server, tiny_seq2seq_dir, tmp_path):
    from attnlab.hf.capture import capture

    page.goto(t5_server + "/#head")
    page.wait_for_selector("#label-a:has-text('Source')")
    assert page.inner_text("#label-b") == "Target"
    page.fill("#sentence-a", SOURCE)
    page.fill("#sentence-b", TARGET)
    page.select_option("#level", "token")
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').textContent.includes('ms')")
    page.wait_for_selector("#head-attention")
    page.select_option("#head-attention", "cross")
    page.wait_for_selector("#head-caption:has-text('cross-attention')")
    layer, head, query = 3, 2, 4
    page.select_option("#head-layer", str(layer))
    page.select_option("#head-head", str(head))
    page.wait_for_selector(f"#head-caption:has-text('layer {layer}, head {head} of 3 × 4')")
    page.wait_for_selector("#head-lines")

    maps = capture([(SOURCE, TARGET)], tiny_seq2seq_dir)
    assert page.locator("#head-words .word").all_inner_texts() == maps.target.tokens[0]  # the target looks
    assert page.locator("#head-keys .word").all_inner_texts() == maps.tokens[0]  # at the source
    # side by side in the lines display: the target's tokens on the left, the source's on the right
    page.wait_for_function("window.attnlab.head.drawn().length > 0")
    want = maps.cross.weights[0][layer - 1, head - 1]
    drawn = np.array(page.evaluate("window.attnlab.head.drawn()"))
    assert len(drawn) == want.size
    np.testing.assert_allclose(drawn[:, 2], want[drawn[:, 0].astype(int), drawn[:, 1].astype(int)], atol=1e-6)
    page.click(f'#head-words .word[data-index="{query}"]')
    page.wait_for_selector("#head-query")
    listed = [(int(li.get_attribute("data-index")), li.locator(".pct").inner_text()) for li in page.locator("#head-row li").all()]
    assert [text for _, text in listed] == [pct1(want[query, j]) for j, _ in listed]
    assert [j for j, _ in listed] == list(np.argsort(-want[query], kind="stable")[:10])
    page.screenshot(path=str((SHOTS or tmp_path) / "serve-cross.png"), full_page=True)

    page.select_option("#head-attention", "decoder")
    page.wait_for_selector("#head-caption:has-text('decoder self-attention')")
    page.wait_for_selector("#head-lines")
    assert page.locator("#head-keys").count() == 0


def test_a_missing_target_is_explained(page, t5_server):
    page.goto(t5_server + "/#head")
    page.wait_for_selector("#head-words .word")  # the first pair: the source copied into the target
    page.fill("#sentence-b", "")
    page.click("#run")
    page.wait_for_selector("#status.error")
    assert "a source and a target" in page.inner_text("#status")


def neuron_weights(page) -> list[str]:
    return page.locator("#view-neuron td.weight").all_inner_texts()


def choose(page, attention: str, layer: int, head: int, query: int) -> None:
    """In the Neuron view: the attention, layer and head, a query token, and the last step."""
    page.wait_for_selector("#view-neuron table.neuron")
    page.select_option("#view-neuron select[aria-label=attention]", label=attention)
    page.select_option("#view-neuron select[aria-label=layer]", str(layer))
    page.select_option("#view-neuron select[aria-label=head]", str(head))
    about = {"cross": "Cross-attention, ", "decoder": "Decoder, "}.get(attention, "")
    page.wait_for_selector(f"#neuron-step:has-text('{about}layer {layer}, head {head};')")
    page.click(f'#view-neuron .strip .word[data-index="{query}"]')
    page.locator("#view-neuron .controls button").last.click()


@pytest.mark.parametrize("where", ["page", "server"])
def test_neuron_view_of_the_three_attentions_with_t5s_position_bias(page, where, t5_server, tiny_seq2seq_dir, tmp_path):
    """Each attention's weights, recomputed in the page from q, k and the position bias, equal capture's
    weights; T5's bias is a step of its own (five steps), with the bias and the biased score as numbers."""
    from attnlab.hf.capture import capture
    from attnlab.viz.page import write_maps_html

    maps = capture([(SOURCE, TARGET)], tiny_seq2seq_dir, qk=True)
    if where == "page":
        page.goto(write_maps_html(maps, tmp_path / "t5.html").as_uri() + "#neuron")
    else:
        page.goto(t5_server + "/#neuron")
        page.fill("#sentence-a", SOURCE)
        page.fill("#sentence-b", TARGET)
        page.click("#run")
        page.wait_for_function("document.querySelector('#status').textContent.includes('ms')")
    n = len(maps.target.tokens[0])
    for attention, layer, head, query, want, bias in (
        ("cross", 3, 2, 4, maps.cross.weights[0], None),
        ("decoder", 2, 4, n - 1, maps.decoder.weights[0], maps.decoder.position_bias[0]),
        ("encoder", 1, 3, 5, maps.weights[0], maps.self_attention.position_bias[0]),
    ):
        choose(page, attention, layer, head, query)
        row = want[layer - 1, head - 1, query]
        assert neuron_weights(page) == [pct1(w) for w in row], attention
        keys = page.locator("#view-neuron tbody tr td:first-child").all_inner_texts()
        assert keys == (maps.tokens[0] if attention != "decoder" else maps.target.tokens[0])
        steps = page.locator("#view-neuron .controls button")
        assert steps.count() == (4 if bias is None else 5), attention
        if bias is not None:
            shown = [float(t) for t in page.locator("#view-neuron td.bias").all_inner_texts()]
            np.testing.assert_allclose(shown, bias[layer - 1, head - 1, query], atol=0.006)
            steps.nth(2).click()
            assert "position bias" in page.inner_text("#neuron-step")
        exact = page.evaluate("(() => { const c = window.attnlab.neuron.current();"
                              " return window.attnlab.neuronRow(c.q[c.query], c.k, c.query, c.meta,"
                              " c.bias && c.bias[c.query]).weights; })()")
        np.testing.assert_allclose(exact, row, atol=1e-5)
    page.screenshot(path=str((SHOTS or tmp_path) / f"neuron-t5-{where}.png"), full_page=True)
