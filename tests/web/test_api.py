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
    from attnlab.web.server import create_app

    # The scene needs no model: an app over a model that does not exist still serves it.
    res = TestClient(create_app("/no/such/model", scene=scene()), base_url="http://localhost").get("/api/scene")
    assert res.status_code == 200
    assert res.json() == scene()


def test_head_weights_equal_the_captured_maps(client, bank_maps):
    words = bank_maps.to_words()
    for level, maps in (("word", words), ("token", bank_maps)):
        res = client.post("/api/head", json={"sentences": BANK, "level": level, "sentence": 1, "layer": 2, "head": 10})
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
    want = sorted((r, l, h) for r in payload.BADGE_ROLES for l, h in roles.heads(r))  # 0-based, as every field
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
    layer0, head0 = want.best if want.best else want.closest[0].head
    assert (shown["layer"], shown["head"], shown["qualifies"]) == (layer0, head0, want.best is not None)
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
    assert client.post("/api/head", json={"sentences": ["I sat."], "layer": -1, "head": 0}).status_code == 422  # 0-based
    assert client.post("/api/head", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    assert client.post("/api/find-head", json={"sentences": BANK, "target": "bank", "deciders": "river"}).status_code == 422


@pytest.mark.parametrize("path, body, words", [
    ("/api/maps", {"sentences": ["word " * 600]}, ["tokens", "512"]),
    ("/api/head", {"sentences": BANK, "layer": 6, "head": 0}, ["layer", "0..5", "6"]),
    ("/api/head", {"sentences": BANK[:1], "sentence": 1, "layer": 0, "head": 0}, ["sentence", "0..0"]),
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
    assert sorted(refs) == ["AttributeIn", "FindHeadIn", "GenerateIn", "HeadIn", "LongColumnIn", "LongIn", "LongOverviewIn",
                           "LongRowIn", "LongTileIn", "MapsIn", "MapsIn", "NeuronIn", "PatchIn", "RolloutIn"]
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


def test_one_capture_serves_every_head_and_level_and_the_cache_is_bounded_in_bytes(default_model, monkeypatch):
    import attnlab.hf.capture as capture_module
    from attnlab.web.server import MapsCache

    calls = []
    real = capture_module.capture
    monkeypatch.setattr(capture_module, "capture", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    one = real(BANK[:1], default_model)
    per_capture = one.weights[0].nbytes + one.to_words().weights[0].nbytes  # both levels
    cache = MapsCache(default_model, None, max_mb=2.5 * per_capture / 1e6)  # room for two captures, not three
    for level in ("word", "token", "word"):
        cache.get(BANK[:1], level)
    assert cache.computed(("k",), lambda: b"x" * 10) == cache.computed(("k",), lambda: b"y")
    assert calls == [BANK[:1]]
    for place in ("lake", "pond", "road", "hill"):  # as many tokens as BANK[0]
        cache.get([f"I sat on the bank of the {place}."], "word")
    assert cache.total == sum(size for _, size in cache.entries.values()) <= cache.max_bytes
    assert ("maps", tuple(BANK[:1]), "word") not in cache.entries  # the oldest went first
    assert ("maps", ("I sat on the bank of the hill.",), "token") in cache.entries
    tiny = MapsCache(default_model, None, max_mb=1e-6)  # one entry larger than the bound is still kept
    tiny.put(("a",), b"12345")
    assert list(tiny.entries) == [("a",)]


# ---------------------------------------------------------------- hardening (issue 10)

SURROGATE = "\ud800"  # valid in JSON ("\ud800"), not encodable as UTF-8


@pytest.mark.parametrize("path, body", [
    ("/api/maps", {"sentences": [f"I sat {SURROGATE} there."]}),
    ("/api/maps", {"sentences": ["I sat."], "level": SURROGATE}),
    ("/api/maps", {"sentences": ["I sat."], SURROGATE: 1}),                       # an unknown key
    ("/api/head", {"sentences": [SURROGATE], "layer": 0, "head": 0}),
    ("/api/find-head", {"sentences": BANK, "target": "bank" + SURROGATE, "deciders": ["river", "money"]}),
    ("/api/find-head", {"sentences": BANK, "target": "bank", "deciders": ["river", SURROGATE]}),
])
def test_a_lone_surrogate_gets_422_with_a_readable_reason(client, path, body):
    import json

    res = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text
    messages = [e["msg"] for e in res.json()["detail"]]
    assert messages and all(isinstance(m, str) and m for m in messages)
    assert SURROGATE not in res.text


def test_after_a_surrogate_the_same_connection_still_answers(live_server):
    import http.client
    import json
    from urllib.parse import urlsplit

    url = urlsplit(live_server)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request("POST", "/api/maps", body=json.dumps({"sentences": [SURROGATE]}),
                     headers={"Content-Type": "application/json"})
        first = conn.getresponse()
        assert first.status == 422 and "not valid text" in first.read().decode()
        conn.request("GET", "/api/info")  # the same keep-alive connection
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read())["num_layers"] == 6
    finally:
        conn.close()


@pytest.mark.parametrize("body, words", [
    ({"sentences": []}, "Type a sentence first"),
    ({"sentences": ["  "]}, "only spaces"),
    ({"sentences": ["a", "b", "c"]}, "At most 2 sentences"),
    ({"sentences": ["x" * 4001]}, "at most 4,000 characters"),
])
def test_empty_or_oversized_input_is_explained_in_words(client, body, words):
    res = client.post("/api/maps", json=body)
    assert res.status_code == 422
    assert words in res.json()["detail"][0]["msg"]
    assert "List should have" not in res.text and "String should" not in res.text


@pytest.mark.parametrize("host, status", [
    ("127.0.0.1:8765", 200), ("localhost:8765", 200), ("LOCALHOST", 200), ("[::1]:8765", 200),
    ("evil.example", 400), ("evil.example:8765", 400), ("127.0.0.1.evil.example", 400), ("localhost.", 400),
])
def test_only_the_viewers_own_host_names_are_answered(client, host, status):
    for path in ("/", "/api/info"):
        res = client.get(path, headers={"Host": host})
        assert res.status_code == status, (path, host, res.text)
    if status == 400:
        assert "not a name this viewer answers to" in res.json()["detail"]


def test_the_host_given_to_serve_is_answered_and_a_wildcard_bind_takes_addresses_not_names():
    from attnlab.web.guard import allowed_hosts

    named = allowed_hosts("viewer.lan")
    assert {"127.0.0.1", "localhost", "[::1]", "viewer.lan"} <= named and "evil.example" not in named
    assert "[fe80::1]" in allowed_hosts("fe80::1")

    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    app = create_app("/no/such/model", scene={"x": 1}, hosts=allowed_hosts("0.0.0.0"))
    c = TestClient(app, base_url="http://127.0.0.1")
    assert c.get("/", headers={"Host": "192.168.1.5:8765"}).status_code == 200
    assert c.get("/", headers={"Host": "[fe80::1]:8765"}).status_code == 200
    assert c.get("/", headers={"Host": "attacker.example:8765"}).status_code == 400


@pytest.mark.parametrize("origin, status", [
    ("http://evil.example", 403), ("null", 403), ("http://127.0.0.1:9999", 403), ("https://localhost", 403),
    ("http://127.0.0.1", 200), (None, 200),
])
def test_cross_origin_posts_are_refused(client, origin, status):
    headers = {"Origin": origin} if origin else {}
    res = client.post("/api/roles", json={"sentences": BANK[:1]}, headers=headers)
    assert res.status_code == status, res.text
    if status == 403:
        assert "cross-origin" in res.json()["detail"]
    assert client.get("/api/info", headers={"Origin": "http://evil.example"}).status_code == 200  # no CORS: unreadable


def test_heavy_work_leaves_light_endpoints_free_and_a_full_queue_gets_503(default_model, monkeypatch):
    """One worker, one place in the queue: with both taken, a third heavy request gets 503 at once,
    while the page, /api/info and /api/scene still answer; once the work ends, everything answers."""
    import threading

    from fastapi.testclient import TestClient

    import attnlab.hf.capture as capture_module
    from attnlab.web.server import create_app

    gate, entered = threading.Event(), threading.Event()
    real = capture_module.capture

    def held(*a, **k):
        entered.set()
        gate.wait(60)
        return real(*a, **k)

    monkeypatch.setattr(capture_module, "capture", held)
    from attnlab.lesson.scene import scene

    app = create_app(default_model, scene=scene(), workers=1, queue=1)
    c = TestClient(app, base_url="http://127.0.0.1")
    pool = app.state.pool
    results: dict[str, int] = {}

    def post(name: str, sentence: str) -> None:
        results[name] = c.post("/api/maps", json={"sentences": [sentence]}).status_code

    threads = [threading.Thread(target=post, args=(f"s{i}", f"Sentence {i}.")) for i in range(2)]
    try:
        threads[0].start()
        assert entered.wait(60)
        threads[1].start()
        for _ in range(600):
            if pool.pending == 2:
                break
            threading.Event().wait(0.05)
        assert pool.pending == 2  # one running, one waiting

        busy = c.post("/api/maps", json={"sentences": ["One more."]})
        assert busy.status_code == 503
        assert int(busy.headers["Retry-After"]) >= 1 and "busy" in busy.json()["detail"]

        light: dict[str, int] = {}

        def ask() -> None:
            for path in ("/", "/viewer.css", "/api/info", "/api/scene"):
                light[path] = c.get(path).status_code

        asker = threading.Thread(target=ask)
        asker.start()
        asker.join(30)  # would wait for the held capture if light requests queued behind it
        assert light == {"/": 200, "/viewer.css": 200, "/api/info": 200, "/api/scene": 200}
    finally:
        gate.set()
        for t in threads:
            t.join(60)
    assert results == {"s0": 200, "s1": 200}
    assert pool.pending == 0
    assert c.post("/api/maps", json={"sentences": ["One more."]}).status_code == 200


def test_find_head_searches_the_occurrence_asked_for(client, default_model):
    """A target that occurs twice: the search says which it used, and searches the second when asked; the
    answers equal attnlab.find_heads' with the same occurrence."""
    import attnlab

    sentences = ["The bank of the river is by the bank.", "I put the money in the bank."]
    words = attnlab.capture(sentences, default_model).to_words()
    req = {"sentences": sentences, "target": "bank", "deciders": ["river", "money"]}
    first = client.post("/api/find-head", json=req).json()
    second = client.post("/api/find-head", json={**req, "occurrence": [2, None]}).json()
    assert "occurs more than once" in first["note"] and "occurrence 1" in first["note"] and second["note"] is None
    for body, occ in ((first, None), (second, [2, None])):
        want = attnlab.find_heads(words, "bank", ["river", "money"], occurrence=occ)
        assert body["summary"] == want.summary()
    assert second["shown"]["sides"][0]["target_index"] == words.spans(0, "bank")[1][0]
    bad = client.post("/api/find-head", json={**req, "occurrence": 3})
    assert bad.status_code == 400 and "occurrence 3" in bad.json()["detail"]
    assert client.post("/api/find-head", json={**req, "occurrence": 0}).status_code == 422


@pytest.mark.parametrize("occurrence", [0, [0], "second", [1, 2, 3], 1001])
def test_a_field_of_several_forms_is_explained_in_one_sentence_without_pydantics_tags(occurrence):
    """occurrence is a number or a list: pydantic fails once per form ("occurrence.constrained-int: …",
    "occurrence.list[nullable[constrained-int]]: …"); the reader gets one sentence naming every form."""
    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    client = TestClient(create_app("/no/such/model"), base_url="http://localhost")  # refused before any model
    res = client.post("/api/find-head", json={"sentences": BANK, "target": "bank", "deciders": ["river", "money"],
                                              "occurrence": occurrence})
    assert res.status_code == 422
    detail = res.json()["detail"]
    assert [e["loc"] for e in detail] == [["body", "occurrence"]]
    assert detail[0]["msg"].startswith("occurrence: which occurrence of the target to search, a whole number from 1")
    assert "constrained" not in res.text and "nullable" not in res.text


def test_every_endpoint_is_its_own_small_function_with_one_error_mapping():
    import inspect

    from attnlab.web import server

    assert [path for path, *_ in server.POSTS] == ["/api/maps", "/api/head", "/api/neuron", "/api/rollout",
                                                   "/api/roles", "/api/find-head", "/api/generate",
                                                   "/api/patch", "/api/attribute", "/api/long/info",
                                                   "/api/long/overview", "/api/long/tile", "/api/long/row",
                                                   "/api/long/column"]
    source = inspect.getsource(server)
    assert source.count("except CLIENT_ERRORS") == 1 and "except ValueError" not in source
