"""The viewer in a real browser (headless Debian Chromium via Playwright) against uvicorn on
127.0.0.1: what the page shows equals the API's numbers and the seed's. Screenshots of each view go
to a temporary folder (or to $ATTNLAB_SCREENSHOT_DIR: the README's come from `docs/`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
log = logging.getLogger(__name__)

SENTENCE = "I sat on the bank of the river."


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("ATTNLAB_SCREENSHOT_DIR") or tmp_path_factory.mktemp("viewer-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    log.warning("viewer screenshots in %s", folder)
    return folder


def shoot(page, path: Path) -> None:
    """A screenshot, cropped to what is drawn and saved with 64 colours: small enough for the README."""
    import io

    from PIL import Image, ImageChops

    img = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    box = ImageChops.difference(img, Image.new("RGB", img.size, "white")).getbbox()
    if box:
        img = img.crop((0, 0, min(img.width, box[2] + 16), min(img.height, box[3] + 16)))
    img.quantize(colors=64).save(path, optimize=True)


def pct1(x: float) -> str:
    return f"{100 * x:.1f} %"


def show_sentence(page, base: str, sentence: str, level: str = "word") -> None:
    page.goto(base + "/#head")
    page.fill("#sentence-a", sentence)
    page.select_option("#level", level)
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').textContent.includes('ms')")
    page.wait_for_selector("#head-words .word")


def test_head_view_shows_the_apis_weights(page, live_server, client, shots):
    show_sentence(page, live_server, SENTENCE)
    page.select_option("#head-layer", "3")
    page.select_option("#head-head", "11")
    page.wait_for_selector("#head-caption:has-text('layer 3, head 11')")
    page.wait_for_selector("#head-lines")
    words = page.locator("#head-words .word").all_inner_texts()
    bank = words.index("bank")
    page.click(f'#head-words .word[data-index="{bank}"]')
    assert page.inner_text("#head-query") == '"bank" looks at'
    shown = [(int(li.get_attribute("data-index")), li.locator(".pct").inner_text())
             for li in page.locator("#head-row li").all()]

    api = client.post("/api/head", json={"sentences": [SENTENCE], "layer": 2, "head": 10}).json()  # 0-based: L3H11
    assert api["labels"] == words
    row = api["weights"][bank]
    want = sorted(range(len(row)), key=lambda j: -row[j])[:10]
    assert [j for j, _ in shown] == want
    assert [text for _, text in shown] == [pct1(row[j]) for j in want]
    shoot(page, shots / "head-lines.png")

    page.select_option("#head-display", "heat")
    page.wait_for_selector("#head-heat")
    shoot(page, shots / "head-heat.png")


def test_token_level_clicking_a_piece_of_a_split_word(page, live_server, client):
    sentence = "Tokenization splits unusual words."
    show_sentence(page, live_server, sentence, level="token")
    tokens = page.locator("#head-words .word").all_inner_texts()
    api = client.post("/api/head", json={"sentences": [sentence], "level": "token", "layer": 0, "head": 0}).json()
    assert tokens == api["labels"] and any(t.startswith("##") for t in tokens)
    j = next(i for i, t in enumerate(tokens) if t.startswith("##"))
    page.click(f'#head-words .word[data-index="{j}"]')
    top = page.locator("#head-row li").first
    row = api["weights"][j]
    best = max(range(len(row)), key=lambda k: row[k])
    assert int(top.get_attribute("data-index")) == best and top.locator(".pct").inner_text() == pct1(row[best])


def test_scene_toggle_shows_the_seeds_weights(page, live_server, shots):
    page.goto(live_server + "/#scene")
    page.wait_for_selector("#scene-table")

    def weights() -> dict[str, str]:
        rows = page.locator("#scene-table tbody tr").all()
        return {r.get_attribute("data-token"): r.locator(".weight").inner_text() for r in rows}

    assert page.inner_text("#scene-step").startswith("Step 1 of 4")  # a learner starts at the start
    assert page.locator("#scene-table .score").count() == 0 and page.is_disabled("#scene-back")
    for _ in range(3):
        page.click("#scene-next")
    assert page.inner_text("#scene-step").startswith("Step 4 of 4")
    before = weights()
    assert [before[t] for t in ("river", "sat", "bank", "I")] == ["60 %", "20 %", "10 %", "2 %"]
    assert "(0.75, 0.05)" in page.inner_text("#scene-output")
    shoot(page, shots / "scene.png")
    page.check("#scene-scale")
    after = weights()
    assert [after[t] for t in ("river", "sat", "bank", "I")] == ["46 %", "21 %", "13 %", "4 %"]
    assert "(0.63, 0.06)" in page.inner_text("#scene-output")
    page.click("#scene-back")
    page.click("#scene-back")
    assert page.locator("#scene-table .weight").count() == 0  # step 2: scores, no weights yet
    assert page.locator("#scene-table .score").first.inner_text() == "-1.13"  # -1.6 / √2


def test_model_view_badges_and_click_through(page, live_server, client, shots):
    show_sentence(page, live_server, SENTENCE)
    page.click('#tabs button[data-view="model"]')
    assert page.locator("#model-grid .cell").count() == 6 * 12
    badges = client.post("/api/maps", json={"sentences": [SENTENCE]}).json()["roles"]["badges"]
    assert page.locator("#model-grid .badge").count() == len(badges)
    prev = next(b for b in badges if b["role"] == "prev")
    cell = page.locator(f'#model-grid .cell[data-layer="{prev["layer"]}"][data-head="{prev["head"]}"]')
    assert "prev" in cell.inner_text()
    shoot(page, shots / "model.png")
    cell.click()
    page.wait_for_selector(f"#head-caption:has-text('layer {prev['layer'] + 1}, head {prev['head'] + 1}')")  # labels 1-based
    assert page.input_value("#head-layer") == str(prev["layer"] + 1)


def test_compare_shows_the_head_search(page, live_server, client, shots):
    page.goto(live_server + "/#compare")
    api = client.post("/api/find-head", json={"sentences": ["I sat on the bank of the river.", "I put the money in the bank."],
                                              "target": "bank", "deciders": ["river", "money"]}).json()
    # the view clears its old answer while a search runs: wait for the summary to read the API's
    summary_is = "(s) => document.querySelector('#compare-summary')?.innerText === s"
    page.wait_for_function(summary_is, arg=api["summary"])
    assert page.locator(".pair .side").count() == 2
    page.check("#compare-exclude-marks")
    page.click("#compare-run")
    marks_out = client.post("/api/find-head", json={"sentences": ["I sat on the bank of the river.", "I put the money in the bank."],
                                                    "target": "bank", "deciders": ["river", "money"], "exclude_marks": True}).json()
    page.wait_for_function(summary_is, arg=marks_out["summary"])
    page.uncheck("#compare-exclude-marks")
    page.click("#compare-run")
    page.wait_for_function(summary_is, arg=api["summary"])
    shoot(page, shots / "compare.png")
    shown = api["shown"]
    page.click("#compare-open")  # opens that head on the compared sentences
    page.wait_for_selector(f"#head-caption:has-text('layer {shown['layer'] + 1}, head {shown['head'] + 1} of')")
    page.wait_for_selector("#head-sentence")  # two sentences now: a sentence selector
    assert page.input_value("#sentence-b") == "I put the money in the bank."
    assert page.locator("#head-words .word").all_inner_texts() == shown["sides"][0]["words"]


def test_self_contained_page_works_from_a_file_without_network(page, bank_maps, tmp_path):
    from attnlab.viz.page import write_maps_html

    from attnlab.lesson.scene import scene

    path = write_maps_html(bank_maps.to_words(), tmp_path / "bank.html", scene=scene(), target="bank", deciders=["river", "money"])
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_selector("#head-words .word")
    page.click('#head-words .word[data-index="5"]')
    words = bank_maps.to_words()
    row = words.weights[0][0, 0, 5]
    first = page.locator("#head-row li").first
    assert first.locator(".pct").inner_text() == pct1(row.max())
    assert page.is_hidden("#input")
    for view in ("model", "scene", "compare"):
        page.click(f'#tabs button[data-view="{view}"]')
        assert page.is_visible(f"#view-{view}")
    assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests


def test_too_long_a_sentence_is_explained_on_the_page(page, live_server):
    page.goto(live_server + "/#head")
    page.wait_for_selector("#head-words .word")
    page.fill("#sentence-a", "word " * 600)
    page.click("#run")
    page.wait_for_selector("#status.error")
    assert "602 tokens" in page.inner_text("#status") and "at most 512" in page.inner_text("#status")
    assert not page.is_disabled("#run")


def test_compare_errors_show_on_the_compare_tab_and_clear_the_old_answer(page, live_server, shots):
    page.goto(live_server + "/#compare")
    page.wait_for_selector("#compare-summary")
    page.fill("#compare-da", "lake")  # not in sentence 1
    page.click("#compare-run")
    page.wait_for_selector("#compare-status.error")
    assert page.is_visible("#compare-status")
    text = page.inner_text("#compare-status")
    assert "lake" in text and "sentence 1" in text
    assert page.locator("#compare-summary").count() == 0 and page.locator(".pair").count() == 0  # no stale answer
    shoot(page, shots / "compare-error.png")
    page.fill("#compare-da", "river")
    page.fill("#compare-target", "")
    page.click("#compare-run")
    page.wait_for_function("document.querySelector('#compare-status').textContent.includes('target word')")
    page.fill("#compare-target", "bank")
    page.click("#compare-run")
    page.wait_for_selector("#compare-summary")
    assert page.inner_text("#compare-status") == "" and not page.locator("#compare-status.error").count()


def test_empty_input_is_explained_in_words(page, live_server):
    page.goto(live_server + "/#head")
    page.wait_for_selector("#head-words .word")
    page.fill("#sentence-a", "   ")
    page.fill("#sentence-b", "")
    page.click("#run")
    page.wait_for_selector("#status.error")
    assert "Type a sentence" in page.inner_text("#status")
    assert "List should" not in page.inner_text("body")


def test_the_sentence_selectors_show_sentences_whole(page, live_server):
    a = "The old man walked slowly along the river bank at dawn with his dog."
    b = "The old man walked slowly along the river bank at dusk with his cat."
    assert a[:40] == b[:40]
    page.goto(live_server + "/#head")
    page.wait_for_selector("#head-words .word")
    page.fill("#sentence-a", a)
    page.fill("#sentence-b", b)
    page.click("#run")
    page.wait_for_selector("#head-sentence")
    assert page.locator("#head-sentence option").all_inner_texts() == [f"1: {a}", f"2: {b}"]
    page.click('#tabs button[data-view="model"]')
    assert page.locator("#model-sentence option").all_inner_texts() == [f"1: {a}", f"2: {b}"]


def test_heat_view_has_word_labels_and_a_colour_scale(page, live_server, shots):
    show_sentence(page, live_server, SENTENCE)
    page.select_option("#head-display", "heat")
    page.wait_for_selector("#head-heat-axes")
    words = page.locator("#head-words .word").all_inner_texts()
    probe = page.evaluate("""() => {
        const c = document.querySelector('#head-heat-axes'), img = document.querySelector('#head-heat');
        const r = window.devicePixelRatio || 1, ctx = c.getContext('2d');
        const left = img.offsetLeft, top = img.offsetTop, px = img.offsetWidth;
        const ink = (x, y, w, h) => { const d = ctx.getImageData(x * r, y * r, w * r, h * r).data;
            let k = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) k++; return k; };
        const at = (x, y) => Array.from(ctx.getImageData(x * r, y * r, 1, 1).data.slice(0, 3));
        return {left, top, px, rowLabels: ink(0, top, left, px), colLabels: ink(left, 0, px, top),
                scaleTop: at(left + px + 18, top + 2), scaleMid: at(left + px + 18, top + px / 2),
                scaleBottom: at(left + px + 18, top + px - 3)};
    }""")
    assert probe["left"] > 40 and probe["top"] > 40  # room for the labels
    assert probe["rowLabels"] > 50 * len(words) and probe["colLabels"] > 50 * len(words)  # text drawn on both axes
    dark = page.evaluate("window.attnlab.heatRGB(1)")
    assert max(abs(a - b) for a, b in zip(probe["scaleTop"], dark)) <= 8  # 100 % at the top
    assert sum(probe["scaleTop"]) < sum(probe["scaleMid"]) < sum(probe["scaleBottom"])
    assert min(probe["scaleBottom"]) > 220  # near white: 0 % at the bottom
    shoot(page, shots / "head-heat.png")
