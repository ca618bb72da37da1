"""The viewer's JSON API: the numbers equal the library's, and bad input gets a clear 4xx, never a 500."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.viz import payload

BANK = ["I sat on the bank of the river.", "I put the money in the bank."]


def test_info_names_the_model_it_was_started_with(client, default_model):
    info = client.get("/api/info").json()
    assert info["model_id"] == default_model.model_id
    assert (info["num_layers"], info["num_heads"]) == (default_model.num_layers, default_model.num_heads)
    assert info["max_tokens"] == 512


def test_scene_endpoint_is_the_scene_of_attnlab_scene():
    from fastapi.testclient import TestClient

    from attnlab.lesson.scene import scene
    from attnlab.viz.server import create_app

    # The scene needs no model: an app over a model that does not exist still serves it.
    res = TestClient(create_app("/no/such/model", scene=scene())).get("/api/scene")
    assert res.status_code == 200
    assert res.json() == scene()


def test_head_weights_equal_the_captured_maps(client, bank_maps):
    words = bank_maps.to_words()
    for level, maps in (("word", words), ("token", bank_maps)):
        res = client.post("/api/head", json={"sentences": BANK, "level": level, "sentence": 1, "layer": 3, "head": 11})
        assert res.status_code == 200, res.text
        body = res.json()
        assert body["labels"] == (words.words[1] if level == "word" else bank_maps.tokens[1])
        got = np.array(body["weights"])
        np.testing.assert_allclose(got, maps.weights[1][2, 10], atol=1e-6)
        np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-4)


def test_maps_carry_labels_marks_overview_and_role_badges(client, bank_maps):
    from attnlab.analysis.roles import head_roles

    words = bank_maps.to_words()
    body = client.post("/api/maps", json={"sentences": BANK, "overview": 4}).json()
    assert body["level"] == "word" and body["model"]["num_layers"] == 6
    s = body["sentences"][0]
    assert s["labels"] == words.words[0] and s["is_mark"] == words.is_mark[0]
    assert s["overview"]["size"] == 4
    np.testing.assert_allclose(np.array(s["overview"]["maps"][2][10]).reshape(4, 4),
                               payload.downsample(words.weights[0][2, 10], 4), atol=1e-4)
    roles = head_roles(words)
    want = sorted((r, l + 1, h + 1) for r in payload.BADGE_ROLES for l, h in roles.heads(r))
    assert sorted((b["role"], b["layer"], b["head"]) for b in body["roles"]["badges"]) == want
    assert set(body["roles"]["legend"]) == set(payload.BADGE_ROLES)


def test_token_level_marks_follow_their_words(client, bank_maps):
    s = client.post("/api/maps", json={"sentences": BANK[:1], "level": "token"}).json()["sentences"][0]
    assert s["labels"] == bank_maps.tokens[0]
    assert [lab for lab, m in zip(s["labels"], s["is_mark"]) if m] == ["[CLS]", ".", "[SEP]"]


def test_find_head_is_the_library_search(client, bank_maps):
    from attnlab.analysis.search import find_heads

    words = bank_maps.to_words()
    want = find_heads(words, "bank", ["river", "money"])
    body = client.post("/api/find-head", json={"sentences": BANK, "target": "bank", "deciders": ["river", "money"]}).json()
    assert body["summary"] == want.summary()
    assert body["result"]["total_heads"] == 72
    shown = body["shown"]
    layer0, head0 = want.best if want.best else (want.closest[0].layer, want.closest[0].head)
    assert (shown["layer"], shown["head"], shown["qualifies"]) == (layer0 + 1, head0 + 1, want.best is not None)
    side = shown["sides"][0]
    assert side["words"][side["target_index"]] == "bank" and side["words"][side["decider_index"]] == "river"
    np.testing.assert_allclose(side["row"], words.weights[0][layer0, head0, side["target_index"]], atol=1e-6)


@pytest.mark.parametrize("body, field", [
    ({"sentences": "I sat."}, "sentences"),                          # a string, not a list
    ({"sentences": []}, "sentences"),                                # none
    ({"sentences": ["a", "b", "c"]}, "sentences"),                   # more than two
    ({"sentences": ["   "]}, "sentences"),                           # blank
    ({"sentences": ["x" * 4001]}, "sentences"),                      # too many characters
    ({"sentences": [3]}, "sentences"),                               # not a string
    ({"sentences": ["I sat."], "level": "piece"}, "level"),          # not a level
    ({"sentences": ["I sat."], "model": "gpt2"}, "model"),           # the model is the server's
    ({"sentences": ["I sat."], "overview": 1000}, "overview"),
])
def test_malformed_maps_requests_get_422_naming_the_field(client, body, field):
    res = client.post("/api/maps", json=body)
    assert res.status_code == 422, res.text
    assert any(field in map(str, e["loc"]) for e in res.json()["detail"])


def test_wrong_types_and_bad_json_get_422(client):
    assert client.post("/api/head", json={"sentences": ["I sat."], "layer": "3", "head": 1}).status_code == 422
    assert client.post("/api/head", json={"sentences": ["I sat."], "layer": 0, "head": 1}).status_code == 422
    assert client.post("/api/head", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    assert client.post("/api/find-head", json={"sentences": BANK, "target": "bank", "deciders": "river"}).status_code == 422


@pytest.mark.parametrize("path, body, words", [
    ("/api/maps", {"sentences": ["word " * 600]}, ["tokens", "512"]),
    ("/api/head", {"sentences": BANK, "layer": 7, "head": 1}, ["layer", "1..6", "7"]),
    ("/api/head", {"sentences": BANK[:1], "sentence": 1, "layer": 1, "head": 1}, ["sentence", "0..0"]),
    ("/api/find-head", {"sentences": BANK, "target": "cat", "deciders": ["river", "money"]}, ["cat", "not in sentence 1"]),
    ("/api/find-head", {"sentences": BANK, "target": "bank", "deciders": ["river"]}, ["deciders", "one per sentence"]),
])
def test_what_the_model_cannot_take_gets_400_with_a_message(client, path, body, words):
    res = client.post(path, json=body)
    assert res.status_code == 400, res.text
    for w in words:
        assert w in res.json()["detail"]


def test_no_endpoint_takes_a_path_and_static_files_are_only_the_page(client):
    schema = client.get("/openapi.json").json()
    refs = [op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
            for item in schema["paths"].values() for op in item.values() if "requestBody" in op]
    assert sorted(refs) == ["FindHeadIn", "HeadIn", "MapsIn", "MapsIn"]
    props = {p for name in refs for p in schema["components"]["schemas"][name]["properties"]}
    assert not props & {"path", "file", "filename", "model", "revision", "folder"}
    assert all(not item.get("get", {}).get("parameters") for item in schema["paths"].values())
    assert client.get("/").headers["content-type"].startswith("text/html")
    for probe in ("/../pyproject.toml", "/static/../server.py", "/server.py", "/viewer.css/../index.html"):
        assert client.get(probe).status_code == 404


def test_downsample_is_the_mean_of_each_block():
    rng = np.random.default_rng(0)
    w = rng.random((2, 3, 10, 10))
    small = payload.downsample(w, 4)
    edges = np.linspace(0, 10, 5).astype(int)
    for i in range(4):
        for j in range(4):
            block = w[..., edges[i]:edges[i + 1], edges[j]:edges[j + 1]]
            np.testing.assert_allclose(small[..., i, j], block.mean(axis=(-1, -2)))
    assert payload.downsample(w, 10) is w
    with pytest.raises(ValueError, match="size"):
        payload.downsample(w, 0)


def test_packed_weights_decode_within_their_resolution():
    import base64

    w = np.random.default_rng(1).dirichlet(np.ones(7), size=(2, 3, 7)).astype(np.float32)  # (2, 3, 7, 7)
    raw = np.frombuffer(base64.b64decode(payload.pack_weights(w)), dtype="<u2").reshape(w.shape)
    np.testing.assert_allclose(raw / 65535, w, atol=0.5 / 65535 + 1e-7)


def test_one_capture_serves_every_head_and_level_and_the_cache_is_bounded(default_model, monkeypatch):
    import attnlab.models.capture as capture_module
    from attnlab.viz.server import MapsCache

    calls = []
    real = capture_module.capture
    monkeypatch.setattr(capture_module, "capture", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    cache = MapsCache(default_model, None, size=2)
    for level in ("word", "token", "word"):
        cache.get(BANK[:1], level)
    cache.maps_payload(BANK[:1], "word", 8)
    assert calls == [BANK[:1]]
    for i in range(4):
        cache.get([f"Sentence number {i}."], "word")
    assert len(cache.entries) == 4  # two captures, each at both levels
    assert (tuple(BANK[:1]), "word") not in cache.entries
