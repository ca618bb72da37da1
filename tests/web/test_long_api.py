"""The long view served: overview, tiles, rows and columns equal the library's and the full map's; bad
requests get one clear 400 (the map's size, the bytes a full map would take), never a 5xx."""

from __future__ import annotations

import base64

import numpy as np
import pytest

pytestmark = pytest.mark.needs("fastapi")

TEXT = "The cat sat on the mat, and the dog sat on the log; then the cat saw the dog."


def f32(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<f4")


@pytest.fixture(scope="module")
def llama(tiny_llama):
    from attnlab.hf.loading import load_model

    return load_model(tiny_llama)


@pytest.fixture(scope="module")
def long_client(llama):
    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    with TestClient(create_app(llama), base_url="http://127.0.0.1") as c:
        yield c


@pytest.fixture(scope="module")
def full(llama):
    from attnlab.hf.capture import capture

    return capture(TEXT, llama).weights[0]  # [L, H, T, T]


def test_info_overview_tile_row_and_column_equal_the_full_map(long_client, full, llama):
    from attnlab.analysis import longview
    from attnlab.hf.capture_long import capture_long

    info = long_client.post("/api/long/info", json={"text": TEXT}).json()
    t = full.shape[-1]
    assert info["num_tokens"] == t and info["full_bytes"] == full.nbytes and info["held_bytes"] < 4 * full.nbytes
    ov = long_client.post("/api/long/overview", json={"text": TEXT, "layer": 1, "head": 2, "cells": 8}).json()
    want = longview.overview(capture_long(TEXT, llama), 1, 2, 8)
    assert (ov["block"], ov["cells"]) == (want.block, want.cells)
    assert np.array_equal(f32(ov["mean"]), want.mean.ravel()) and np.array_equal(f32(ov["max"]), want.max.ravel())
    tile = long_client.post("/api/long/tile", json={"text": TEXT, "layer": 1, "head": 2, "rows": [5, 30],
                                                    "cols": [0, 20]}).json()
    np.testing.assert_allclose(f32(tile["weights"]).reshape(25, 20), full[1, 2, 5:30, 0:20], rtol=0, atol=1e-6)
    row = long_client.post("/api/long/row", json={"text": TEXT, "layer": 0, "head": 3, "query": t - 1, "top": 4}).json()
    np.testing.assert_allclose(f32(row["weights"]), full[0, 3, t - 1], rtol=0, atol=1e-6)
    assert [k["key"] for k in row["top"]] == list(np.argsort(-full[0, 3, t - 1], kind="stable")[:4])
    assert row["top"][0]["token"] == info["tokens"][row["top"][0]["key"]]
    col = long_client.post("/api/long/column", json={"text": TEXT, "layer": 0, "head": 0, "key": 3}).json()
    np.testing.assert_allclose(f32(col["weights"]), full[0, 0, :, 3], rtol=0, atol=1e-6)


@pytest.mark.parametrize("path, body, words", [
    ("/api/long/tile", {"rows": [10, 90], "cols": [0, 4]}, "rows must be (start, stop) with 0 <= start < stop <= "),
    ("/api/long/tile", {"rows": [9, 9], "cols": [0, 4]}, "0 <= start < stop"),
    ("/api/long/row", {"query": 500}, "query must be 0.."),
    ("/api/long/column", {"key": 64}, "key must be 0.."),
    ("/api/long/overview", {"layer": 7}, "layer"),
])
def test_requests_outside_the_map_get_400_saying_its_size(long_client, path, body, words):
    res = long_client.post(path, json={"text": TEXT, "layer": 0, "head": 0, **body})
    assert res.status_code == 400, res.text
    assert words in res.json()["detail"]


def test_a_tile_larger_than_the_limit_gets_400(long_client, monkeypatch):
    from attnlab.web import longview

    monkeypatch.setattr(longview, "MAX_TILE", 8)
    res = long_client.post("/api/long/tile", json={"text": TEXT, "layer": 0, "head": 0, "rows": [0, 9], "cols": [0, 4]})
    assert res.status_code == 400 and "a tile is at most 8 × 8" in res.json()["detail"]


def test_the_full_map_of_a_long_input_is_refused_with_its_size_and_the_long_view_offered(long_client, monkeypatch):
    from attnlab.web import work

    monkeypatch.setattr(work, "SERVER_MAP_BYTES", 10_000)
    res = long_client.post("/api/head", json={"sentences": [TEXT + " again"], "layer": 0, "head": 0})
    assert res.status_code == 400, res.text
    detail = res.json()["detail"]
    assert "of T × T attention weights, over the limit of 10.0 kB" in detail and "/api/long/tile" in detail
    assert long_client.get("/api/info").status_code == 200  # still answering


def test_text_past_the_positions_and_past_the_characters(long_client, llama):
    res = long_client.post("/api/long/info", json={"text": "word " * 100})
    assert res.status_code == 400 and f"takes at most {llama.max_tokens}" in res.json()["detail"]
    res = long_client.post("/api/maps", json={"sentences": ["x" * 4001]})
    assert res.status_code == 422 and "goes to the long view" in res.json()["detail"][0]["msg"]
    assert long_client.get("/api/info").json()["long_max_chars"] == 262_144


def test_a_long_view_outlives_the_payloads_made_from_it(llama, monkeypatch):
    """A long text's queries and keys can outweigh the whole maps cache (0.7 GB at 32,768 tokens of 64 heads):
    kept apart, the payloads computed from them never push them out (each overview captured its text again), and
    the long views themselves are bounded by the bytes given, the newest kept."""
    import attnlab.hf.capture_long as capture_long_module
    from attnlab.web.work import MapsCache

    calls = []
    real = capture_long_module.capture_long
    monkeypatch.setattr(capture_long_module, "capture_long", lambda text, *a, **k: calls.append(text) or real(text, *a, **k))
    cache = MapsCache(llama, None, max_mb=1e-6)  # smaller than any long view and any payload
    first = cache.get_long(TEXT, 2**30)
    for head in range(3):
        cache.computed(("long-overview", TEXT, 0, head), lambda: b"x" * 1000)
        assert cache.get_long(TEXT, 2**30) is first
    assert calls == [TEXT]
    other = TEXT.replace("cat", "fox")
    room = int(1.5 * first.nbytes)  # room for one of the two texts, not both: the older goes
    cache.get_long(other, room)
    assert list(cache.long) == [other]
    cache.get_long(other, room)
    assert calls == [TEXT, other]
