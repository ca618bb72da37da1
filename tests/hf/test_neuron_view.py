"""The Neuron view: its data reproduce the captured weights, and in a real browser (headless
Chromium) the page's recomputed weights equal capture's, for a decoder with softcap and a window."""

import numpy as np
import pytest

from attnlab.hf.capture import capture
from attnlab.viz.neuron import neuron_payload
from attnlab.viz.page import maps_html

pytestmark = pytest.mark.needs("torch", "transformers")

SENTENCE = "The river runs past the bank, slowly!"


def test_payload_holds_queries_keys_and_how_to_combine_them(tiny_folder):
    maps = capture([SENTENCE], tiny_folder("gemma2"), qk=True)
    data = neuron_payload(maps)
    s = data["sentences"][0]
    assert np.asarray(s["q"]).shape == maps.self_attention.queries[0].shape and data["meta"]["softcap"] == [0.5, 0.5]
    assert neuron_payload(capture([SENTENCE], tiny_folder("gemma2"))) is None  # no qk: no view


def test_page_has_the_neuron_view_only_with_queries(tiny_folder):
    maps = capture([SENTENCE], tiny_folder("llama"), qk=True)
    assert '"neuron":{"model"' in maps_html(maps)
    assert '"neuron":' not in maps_html(capture([SENTENCE], tiny_folder("llama")))


@pytest.mark.browser
@pytest.mark.parametrize("arch", ["gemma2", "llama"])
def test_browser_neuron_weights_equal_capture(tiny_folder, tmp_path, page, arch):
    maps = capture([SENTENCE], tiny_folder(arch), qk=True)
    page_file = tmp_path / "page.html"
    page_file.write_text(maps_html(maps), encoding="utf-8")
    layer, head, query = 1, 3, 6  # 0-based: layer 2, head 4, the seventh token
    page.goto(page_file.as_uri() + "#neuron")
    page.wait_for_selector("#view-neuron table.neuron")
    page.select_option("#view-neuron select[aria-label=layer]", str(layer + 1))
    page.select_option("#view-neuron select[aria-label=head]", str(head + 1))
    page.locator("#view-neuron .strip .word").nth(query).click()
    page.get_by_role("button", name="step 3").click()
    shown = page.locator("#view-neuron td.weight").all_inner_texts()
    exact = page.evaluate(
        "([l, h, i]) => { const s = window.attnlab; const d = JSON.parse(document.getElementById('attnlab-data').textContent).neuron;"
        " const x = d.sentences[0], meta = {scale: d.meta.scale[l], softcap: d.meta.softcap[l],"
        " causal: d.meta.causal[l], window: d.meta.window[l]};"
        " return s.neuronRow(x.q[l][h][i], x.k[l][h], i, meta, null).weights; }",
        [layer, head, query])
    want = maps.weights[0][layer, head, query]
    assert shown == [f"{100 * w:.1f} %" for w in want]
    np.testing.assert_allclose(exact, want, atol=1e-5)
