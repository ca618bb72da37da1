"""The self-contained page: everything inline, nothing from the network, the data it embeds equal
to the captured maps; the notebook frame; `attnlab maps --html`."""

from __future__ import annotations

import base64
import html
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest

from attnlab.viz.page import DATA_ID, maps_html, notebook_html, render_page, write_maps_html
from attnlab.web.server import STATIC_FILES

URL = re.compile(r"^\s*(https?:)?//", re.I)


class Resources(HTMLParser):
    """Every URL a page would load: script src, link href, img src (and any other src)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "audio", "video", "source") and a.get("src"):
            self.urls.append(a["src"])
        if tag == "link" and a.get("href"):
            self.urls.append(a["href"])


def loaded_urls(page: str) -> list[str]:
    p = Resources()
    p.feed(page)
    return [u for u in p.urls if not u.startswith("data:")]  # the empty favicon, inline


def embedded(page: str) -> dict:
    m = re.search(rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def test_served_pages_load_nothing_from_the_network(client):
    urls = {"/" + u for page in ("/", "/long") for u in loaded_urls(client.get(page).text)}  # the viewer, the long view
    assert urls and not [u for u in urls if URL.match(u)]
    assert sorted(urls) == sorted(p for p in STATIC_FILES if p not in ("/", "/long"))
    for path in ("/docs", "/redoc"):  # FastAPI's would load Swagger UI from a CDN
        assert client.get(path).status_code == 404
    for path in STATIC_FILES:
        body = client.get(path).text
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", body, re.I), path
        assert not re.search(r"""(import|fetch)\s*\(\s*["'](https?:)?//""", body, re.I), path


def test_self_contained_page_inlines_everything(bank_maps):
    page = maps_html(bank_maps.to_words(), target="bank", deciders=["river", "money"])
    assert loaded_urls(page) == []  # no src, no href: scripts and styles are inline
    assert "http://" not in page and "https://" not in page
    data = embedded(page)
    assert set(data) == {"scene", "maps", "search", "rollout"} and data["search"]["summary"].startswith("No head of 72")


def test_embedded_maps_decode_to_the_captured_weights(bank_maps):
    for maps in (bank_maps, bank_maps.to_words()):
        data = embedded(maps_html(maps))["maps"]
        for i, w in enumerate(maps.weights):
            raw = np.frombuffer(base64.b64decode(data["packed"][i]), dtype="<u2").reshape(w.shape)
            np.testing.assert_allclose(raw / 65535, w, atol=1e-5)
            assert len(data["sentences"][i]["labels"]) == w.shape[-1]


def test_text_that_looks_like_html_cannot_break_out_of_the_data():
    data = {"scene": None, "maps": None, "search": None, "note": "</script><script>alert(1)</script>"}
    page = render_page(data)
    assert page.count("<script>alert(1)") == 0
    assert embedded(page)["note"] == data["note"]


def test_notebook_frame_holds_the_whole_page(bank_maps):
    frame = bank_maps._repr_html_()
    assert frame == notebook_html(bank_maps)
    doc = html.unescape(re.search(r'srcdoc="(.*?)"', frame, re.S).group(1))
    assert doc == maps_html(bank_maps)
    assert bank_maps.to_words()._repr_html_().startswith("<iframe srcdoc=")


def test_write_maps_html_adds_the_suffix_and_names_a_missing_folder(bank_maps, tmp_path):
    assert write_maps_html(bank_maps, tmp_path / "bank").name == "bank.html"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_maps_html(bank_maps, tmp_path / "missing" / "bank.html")


def test_cli_maps_html_writes_the_page(default_model, tmp_path, capsys):
    from attnlab.cli.app import main

    out = tmp_path / "maps.html"
    assert main(["maps", "I sat on the bank of the river.", "--words", "--html", str(out)]) == 0
    data = embedded(out.read_text())
    assert data["maps"]["level"] == "word"
    assert data["maps"]["sentences"][0]["labels"][5] == "bank"


def test_a_page_too_large_is_refused_with_its_bytes_before_packing(bank_maps, monkeypatch):
    from attnlab.viz import page

    monkeypatch.setattr(page, "MAX_PAGE_BYTES", 1000)
    monkeypatch.setattr(page.payload, "pack_weights", lambda *a: pytest.fail("packed before the check"))
    with pytest.raises(ValueError, match=r"would hold .* of packed weights, over the limit of 1.0 kB; write the long "
                                         r"view's page instead"):
        page.maps_html(bank_maps)
