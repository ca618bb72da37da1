"""The long view in Chromium: what the page draws (the overview's pixels, the zoomed tile, a row's top
keys, the reading view's shades) equals the library's values, served and as a self-contained page."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.needs("fastapi")

TEXT = "The cat sat on the mat, and the dog sat on the log; then the cat saw the dog."


def heat_rgb(w):
    """core.js's AL.heatRGB: white to blue, on the square root."""
    t = np.sqrt(np.clip(w, 0, 1))
    return np.stack([np.round(255 - 225 * t), np.round(255 - 160 * t), np.round(255 - 20 * t)], -1)


@pytest.fixture(scope="module")
def long(tiny_llama):
    from attnlab.hf.capture_long import capture_long
    from attnlab.hf.loading import load_model

    return capture_long(TEXT, load_model(tiny_llama))


def _pixels(page, selector):
    """The canvas's own pixels (its width × height, RGB), as the page drew them."""
    data = page.evaluate(f"""() => {{ const c = document.querySelector('{selector}');
        return [c.width, c.height, Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)]; }}""")
    w, h, px = data
    return np.array(px, dtype=float).reshape(h, w, 4)[..., :3]


def _check_overview(page, long, layer, head, atol):
    from attnlab.analysis import longview

    ov = longview.overview(long, layer, head, 512)
    shown = page.evaluate("() => { const s = attnlab.long.shown.overview; return [s.layer, s.head, Array.from(s.values)]; }")
    assert shown[:2] == [layer, head]
    np.testing.assert_allclose(shown[2], ov.max.ravel(), rtol=atol, atol=1e-7)
    pos = np.sort(np.asarray(shown[2], dtype=np.float32)[np.asarray(shown[2]) > 0])
    scale = pos[int(np.floor(0.99 * (len(pos) - 1)))]  # long.js: the 99th percentile of the non-zero cells
    np.testing.assert_allclose(_pixels(page, "#long-overview"), heat_rgb(np.asarray(shown[2]).reshape(ov.max.shape) / scale),
                               atol=1)


def _check_row(page, long, layer, head, query, exact):
    from attnlab.analysis import longview

    top = longview.top_keys(long, layer, head, query, 10)
    page.wait_for_function(f"() => attnlab.long.shown.row && attnlab.long.shown.row.query === {query}")
    got = page.evaluate("() => attnlab.long.shown.row.top.map((t) => [t.key, t.weight])")
    k = len(got)
    assert [g[0] for g in got] == [j for j, _ in top[:k]]
    np.testing.assert_allclose([g[1] for g in got], [w for _, w in top[:k]], rtol=0 if exact else 1e-3,
                               atol=1e-7 if exact else 1e-4)
    cells = page.locator("#long-top tr.top-key td.weight").all_inner_texts()
    assert cells[0].endswith(" %") and float(cells[0][:-2]) == pytest.approx(100 * top[0][1], rel=5e-3)  # 3 digits
    shade = page.evaluate("() => Array.from(attnlab.long.shown.shade.values)")
    if exact:  # served: the whole row shades the reading view
        np.testing.assert_allclose(shade, longview.row(long, layer, head, query), rtol=0, atol=1e-7)


def test_served_long_view_draws_the_librarys_values(page, long_server, long):
    from attnlab.analysis import longview

    page.goto(long_server + "/long")
    page.fill("#long-text", TEXT)
    page.click("#run")
    page.wait_for_function("() => attnlab.long.shown.overview && attnlab.long.shown.row")
    _check_overview(page, long, 0, 0, atol=0)
    _check_row(page, long, 0, 0, long.num_tokens - 1, exact=True)
    page.click("#long-next")  # the same query in the next head
    page.wait_for_function("() => attnlab.long.shown.overview.head === 1")
    _check_overview(page, long, 0, 1, atol=0)
    _check_row(page, long, 0, 1, long.num_tokens - 1, exact=True)
    box = page.locator("#long-overview").bounding_box()  # drag over the map's upper-left quarter: a region exactly
    page.mouse.move(box["x"] + 2, box["y"] + 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.up()
    page.wait_for_function("() => attnlab.long.shown.tile")
    tile = page.evaluate("() => { const t = attnlab.long.shown.tile; return [t.rows, t.cols, Array.from(t.weights)]; }")
    (r0, r1), (c0, c1) = tile[0], tile[1]
    assert r0 == 0 and c0 == 0 and r1 > 8
    want = longview.weights(long, 0, 1, (r0, r1), (c0, c1))
    np.testing.assert_allclose(np.array(tile[2]).reshape(want.shape), want, rtol=0, atol=0)
    page.evaluate("() => { const s = document.querySelector('#long-shade'); s.value = 'column'; "
                  "s.dispatchEvent(new Event('change')); }")
    page.wait_for_function("() => attnlab.long.shown.column")
    col = page.evaluate("() => Array.from(attnlab.long.shown.column.weights)")
    np.testing.assert_allclose(col, longview.column(long, 0, 1, long.num_tokens - 1), rtol=0, atol=0)


def test_offline_long_page_draws_the_librarys_values(page, long, tmp_path):
    from attnlab.viz.longpage import write_long_html

    path = write_long_html(long, tmp_path / "long")
    page.goto(path.as_uri())
    page.wait_for_function("() => attnlab.long.shown.overview && attnlab.long.shown.row")
    _check_overview(page, long, 0, 0, atol=1e-3)  # float16 in the file
    _check_row(page, long, 0, 0, long.num_tokens - 1, exact=False)
    for select, value in (("#long-layer", 1), ("#long-head", 2)):  # as a person's choice: the value, then change
        page.evaluate(f"() => {{ const s = document.querySelector('{select}'); s.value = '{value}'; "
                      "s.dispatchEvent(new Event('change')); }")
    page.wait_for_function("() => attnlab.long.shown.overview.layer === 1 && attnlab.long.shown.overview.head === 2")
    _check_overview(page, long, 1, 2, atol=1e-3)
    page.locator("#long-read span").nth(7).click()
    _check_row(page, long, 1, 2, 7, exact=False)
    page.locator("#long-overview").click(position={"x": 10, "y": 10})  # a tile needs the server: the page says so
    page.wait_for_function("() => document.getElementById('long-zoom-caption').textContent.includes('serve')")
