"""An encoder–decoder's page: the head view's "cross" choice draws the captured cross-attention
(target tokens on the left, source tokens on the right), in headless Chromium, for a tiny T5 built
here (tests/tiny_models.py's builder)."""

from __future__ import annotations

import base64
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from attnlab.hf.capture import capture
from attnlab.viz import payload
from attnlab.viz.page import page_data, write_maps_html

pytestmark = pytest.mark.needs("torch", "transformers")

import tiny_models as tiny

PAIR = ("I sat on the bank of the river.", "The river runs past the bank, slowly!")
SHOTS = Path(os.environ["ATTNLAB_SCREENSHOT_DIR"]) if os.environ.get("ATTNLAB_SCREENSHOT_DIR") else None
QUANTUM = 1 / 65535  # the embedded page's uint16 packing: rounding error ≤ half of this


@pytest.fixture(scope="module")
def t5_maps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-t5-cross")
    tiny.build("t5", folder)
    return capture([PAIR], folder), folder


def _unpack(text: str, shape: tuple) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u2").reshape(shape) / 65535


def test_payload_packs_decoder_and_cross_attention(t5_maps):
    maps, _ = t5_maps
    data = page_data(maps)["maps"]["seq2seq"]
    s, dec = data["sentences"][0], maps.decoder
    assert s["source"] == maps.tokens[0] and s["target"] == maps.target.tokens[0] and s["target"][0] == "<pad>"
    assert data["model"] == {"num_layers": 3, "num_heads": 4}
    np.testing.assert_allclose(_unpack(s["cross"], maps.cross.weights[0].shape), maps.cross.weights[0], atol=QUANTUM)
    np.testing.assert_allclose(_unpack(s["decoder"], dec.weights[0].shape), dec.weights[0], atol=QUANTUM)
    words = payload.seq2seq_payload(maps.to_words())  # word level: the same maps over words
    assert words["level"] == "word" and data["level"] == "token"
    assert words["sentences"][0]["source"] == maps.words[0] and words["sentences"][0]["target"] == maps.target.words[0]
    assert payload.seq2seq_payload(replace(maps, decoder=None, cross=None)) is None  # the encoder's alone


def test_cli_maps_html_of_a_pair_has_the_cross_attention(t5_maps, tmp_path):
    import json
    import re

    from attnlab.cli.app import main

    maps, folder = t5_maps
    page = tmp_path / "pair.html"
    assert main(["maps", "\t".join(PAIR), "--model", str(folder), "--html", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', text, re.S).group(1))
    s = data["maps"]["seq2seq"]["sentences"][0]
    assert (s["source"], s["target"]) == (maps.tokens[0], maps.target.tokens[0])
    np.testing.assert_allclose(_unpack(s["cross"], maps.cross.weights[0].shape), maps.cross.weights[0], atol=QUANTUM)


@pytest.mark.browser
def test_browser_cross_view_draws_the_cross_weights(t5_maps, page, tmp_path):
    maps, _ = t5_maps
    path = write_maps_html(maps, tmp_path / "cross.html")
    layer, head, query = 3, 2, 4  # 1-based layer and head; the fifth target token
    page.goto(path.as_uri() + "#head")
    page.wait_for_selector("#head-lines")
    page.select_option("#head-attention", "cross")
    page.wait_for_selector("#head-caption:has-text('cross-attention')")
    page.select_option("#head-layer", str(layer))
    page.select_option("#head-head", str(head))
    page.wait_for_selector(f"#head-caption:has-text('layer {layer}, head {head} of 3 × 4')")
    page.wait_for_selector("#head-lines")
    assert page.locator("#head-words .word").all_inner_texts() == maps.target.tokens[0]  # queries: the target
    assert page.locator("#head-keys .word").all_inner_texts() == maps.tokens[0]  # keys: the source
    want = maps.cross.weights[0][layer - 1, head - 1]  # (T_target, T_source)

    # Nothing chosen: a line for every (target, source) pair on screen, weighted by the map.
    page.wait_for_function("window.attnlab.head.drawn().length > 0")
    drawn = np.array(page.evaluate("window.attnlab.head.drawn()"))
    rows, cols = drawn[:, 0].astype(int), drawn[:, 1].astype(int)
    assert len(drawn) == want.size and set(rows) == set(range(want.shape[0])) and set(cols) == set(range(want.shape[1]))
    np.testing.assert_allclose(drawn[:, 2], want[rows, cols], atol=QUANTUM)

    # One target token chosen: its row of lines to every source token, and the list of the largest.
    page.click(f'#head-words .word[data-index="{query}"]')
    page.wait_for_selector("#head-query")
    assert page.inner_text("#head-query") == f'"{maps.target.tokens[0][query]}" looks at'
    page.wait_for_function(f"(d => d.length === {want.shape[1]} && d.every((x) => x[0] === {query}))"
                           "(window.attnlab.head.drawn())")
    drawn = np.array(page.evaluate("window.attnlab.head.drawn()"))
    np.testing.assert_array_equal(drawn[:, 1], np.arange(want.shape[1]))
    np.testing.assert_allclose(drawn[:, 2], want[query], atol=QUANTUM)
    listed = [(int(li.get_attribute("data-index")), li.locator(".pct").inner_text())
              for li in page.locator("#head-row li").all()]
    top = np.argsort(-want[query], kind="stable")[:10]
    assert [f"{100 * w:.1f} %" for w in want[query][[j for j, _ in listed]]] == [t for _, t in listed]
    np.testing.assert_allclose(sorted(want[query][[j for j, _ in listed]], reverse=True), want[query][top], atol=QUANTUM)
    page.screenshot(path=str(SHOTS / "cross-lines.png") if SHOTS else str(tmp_path / "cross-lines.png"))

    page.select_option("#head-display", "heat")
    page.wait_for_selector("#head-heat")
    size = page.evaluate("(() => { const c = document.getElementById('head-heat'); return [c.height, c.width]; })()")
    assert size == list(want.shape)  # one pixel per (target, source) cell
    page.screenshot(path=str(SHOTS / "cross-heat.png") if SHOTS else str(tmp_path / "cross-heat.png"))

    page.select_option("#head-attention", "decoder")  # the decoder's own causal self-attention
    page.wait_for_selector("#head-caption:has-text('decoder self-attention')")
    page.select_option("#head-display", "lines")
    page.wait_for_selector("#head-lines")
    assert page.locator("#head-keys").count() == 0  # self-attention: one strip, rows and columns alike
    page.click(f'#head-words .word[data-index="{query}"]')
    keys = maps.decoder.weights[0].shape[-1]  # drawn once the query's row of this strip is (not before: a race)
    page.wait_for_function(f"(d => d.length === {keys} && d.every((x) => x[0] === {query}))"
                           "(window.attnlab.head.drawn())")
    drawn = np.array(page.evaluate("window.attnlab.head.drawn()"))
    np.testing.assert_allclose(drawn[:, 2], maps.decoder.weights[0][layer - 1, head - 1, query], atol=QUANTUM)
    assert np.all(drawn[drawn[:, 1] > query, 2] == 0)  # causal: nothing after the query
