"""The Rollout view's data: the server's /api/rollout and the page's embedded rollout equal
attnlab.rollout and attnlab.flow (the page within its uint16 packing), and bad requests get a 422 or
a 400 that says what is wrong, never a 500."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

import attnlab
from attnlab.analysis.rollout import flow_one  # attnlab.flow of one sentence
from attnlab.viz import rollout_view as rv

BANK = ["I sat on the bank of the river.", "I put the money in the bank."]


def unpack(b64: str, shape: tuple) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<u2").reshape(shape) / 65535


# ---------------------------------------------------------------- the payloads, on synthetic maps


def test_each_layer_is_the_librarys_rollout(make_maps):
    maps = make_maps([["a", "b", "c", "d"], ["e", "f", "g"]], num_layers=3, num_heads=2, pieces=[[1, 2, 1, 1], [1, 1, 1]])
    for residual in (0.0, 0.3, 0.5):
        want = attnlab.rollout(maps, residual)
        for i in range(2):
            for layer in (0, 1, 2):  # 0-based
                got = rv.rollout_layer(maps, i, layer, residual)
                np.testing.assert_allclose(got["weights"], want[i][layer], atol=1e-12)
                assert got["labels"] == maps.tokens[i] and got["num_layers"] == 3 and got["flow_refusal"] is None
    # an independent check of the definition: layer 0 is the mixed head mean, rows summing to 1
    w = maps.weights[0].astype(np.float64)
    first = 0.5 * np.eye(5) + 0.5 * w[0].mean(axis=0)
    np.testing.assert_allclose(rv.rollout_layer(maps, 0, 0, 0.5)["weights"], first / first.sum(-1, keepdims=True), atol=1e-12)


def test_flow_at_each_layer_is_the_librarys_flow(make_maps):
    maps = make_maps([["a", "b", "c", "d"]], num_layers=2, num_heads=2).to_words()
    for layer in (0, 1):
        got = rv.rollout_layer(maps, 0, layer, 0.4, "flow")
        np.testing.assert_allclose(got["weights"], attnlab.flow(maps, 0.4, layer=layer)[0], atol=1e-12)
        np.testing.assert_allclose(got["weights"].sum(-1), 1.0)
        assert got["labels"] == maps.words[0]


def test_the_page_embeds_rollout_at_half_and_flow_where_short(make_maps):
    short, long = ["a", "b", "c"], [f"w{k}" for k in range(rv.FLOW_MAX_POSITIONS + 1)]
    maps = make_maps([short, long], num_layers=2, num_heads=3)
    data = rv.page_rollout(maps)
    assert (data["residual"], data["num_layers"], data["flow_layer"]) == (0.5, 2, 1)  # flow through the last layer, 0-based
    rolled = attnlab.rollout(maps, 0.5)
    s0, s1 = data["sentences"]
    np.testing.assert_allclose(unpack(s0["rollout"], (2, 3, 3)), rolled[0], atol=1 / 65535)
    np.testing.assert_allclose(unpack(s0["flow"], (3, 3)), flow_one(maps.weights[0], 0.5), atol=1 / 65535)
    assert s0["flow_refusal"] is None and s0["positions"] == 3
    n = rv.FLOW_MAX_POSITIONS + 1
    np.testing.assert_allclose(unpack(s1["rollout"], (2, n, n)), rolled[1], atol=1 / 65535)
    assert s1["flow"] is None and f"has {n} tokens" in s1["flow_refusal"] and "sentence 2" in s1["flow_refusal"]


@pytest.mark.parametrize("kwargs, message", [
    ({"sentence": 2}, "sentence must be 0..1, got 2"),
    ({"layer": -1}, "layer must be 0..1 (0-based"),
    ({"layer": 2}, "layer must be 0..1 (0-based"),
    ({"residual": 1.0}, "residual must be a number in [0, 1), got 1.0"),
    ({"residual": -0.1}, "residual must be a number in [0, 1)"),
    ({"method": "mean"}, "method must be one of 'rollout', 'flow', got 'mean'"),
    ({"sentence": 1, "method": "flow"}, f"up to {rv.FLOW_MAX_POSITIONS} positions and sentence 2 has"),
])
def test_bad_requests_name_the_argument(make_maps, kwargs, message):
    maps = make_maps([["a", "b"], [f"w{k}" for k in range(rv.FLOW_MAX_POSITIONS + 1)]], num_layers=2)
    args = {"sentence": 0, "layer": 0, "residual": 0.5, "method": "rollout", **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        rv.rollout_layer(maps, args["sentence"], args["layer"], args["residual"], args["method"])


def test_the_server_keeps_a_sentences_rollout_once_per_residual(make_maps):
    from attnlab.web.work import MapsCache

    maps = make_maps([["a", "b", "c"]], num_layers=3)
    cache = MapsCache(None, None)
    key = (("a b c",), "token")
    for layer in (0, 1, 2):
        got = rv.served_rollout(cache, maps, key, 0, layer, 0.25, "rollout")
        np.testing.assert_allclose(got["weights"], attnlab.rollout(maps, 0.25)[0][layer], atol=1e-12)
    assert len(cache.entries) == 1 and cache.total == 3 * 3 * 3 * 8  # one [L, T, T] float64, counted
    rv.served_rollout(cache, maps, key, 0, 1, 0.75, "rollout")
    assert len(cache.entries) == 2


# ---------------------------------------------------------------- the server's endpoint


def post(client, **body):
    return client.post("/api/rollout", json={"sentences": BANK, "layer": 5, **body})  # the last, 0-based


def test_api_rollout_equals_the_librarys_at_both_levels(client, bank_maps):
    for level, maps in (("word", bank_maps.to_words()), ("token", bank_maps)):
        want = attnlab.rollout(maps, 0.3)
        for sentence, layer in ((0, 0), (1, 2), (1, 5)):
            res = post(client, level=level, sentence=sentence, layer=layer, residual=0.3)
            assert res.status_code == 200, res.text
            body = res.json()
            assert (body["level"], body["layer"], body["method"], body["num_layers"]) == (level, layer, "rollout", 6)
            assert body["labels"] == (maps.words if level == "word" else maps.tokens)[sentence]
            np.testing.assert_allclose(body["weights"], want[sentence][layer], atol=1e-6)
            assert body["flow_refusal"] is None and body["flow_max_positions"] == rv.FLOW_MAX_POSITIONS


def test_api_flow_equals_the_librarys_flow(client, bank_maps):
    words = bank_maps.to_words()
    body = post(client, sentence=1, layer=1, method="flow").json()
    np.testing.assert_allclose(body["weights"], attnlab.flow(words, 0.5, layer=1)[1], atol=1e-6)


def test_api_default_residual_is_half(client, bank_maps):
    body = post(client, layer=3).json()
    assert body["residual"] == 0.5
    np.testing.assert_allclose(body["weights"], attnlab.rollout(bank_maps.to_words())[0][3], atol=1e-6)


@pytest.mark.parametrize("body, field", [
    ({"residual": 1}, "residual"), ({"residual": 1.5}, "residual"), ({"residual": -0.01}, "residual"),
    ({"residual": "0.5"}, "residual"), ({"residual": True}, "residual"), ({"residual": None}, "residual"),
    ({"method": "attention"}, "method"), ({"layer": -1}, "layer"), ({"sentence": 2}, "sentence"),
    ({"sentence": -1}, "sentence"), ({"level": "char"}, "level"), ({"heads": 1}, "heads"),
])
def test_malformed_requests_get_a_422_naming_the_field(client, body, field):
    res = post(client, **body)
    assert res.status_code == 422, res.text
    assert any(e["loc"][-1] == field or field in e["msg"] for e in res.json()["detail"])


def test_a_residual_that_is_not_a_number_is_a_422(client):
    body = json.dumps({"sentences": BANK, "layer": 0}).replace("}", ', "residual": NaN}')
    res = client.post("/api/rollout", content=body, headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text


@pytest.mark.parametrize("body, words", [
    ({"sentences": BANK[:1], "sentence": 1}, ["sentence must be 0..0, got 1"]),
    ({"layer": 6}, ["layer must be 0..5", "got 6"]),
    ({"sentences": [" ".join(["word"] * 40)], "method": "flow"},
     [f"up to {rv.FLOW_MAX_POSITIONS} positions", "sentence 1 has 42 words"]),
    ({"sentences": ["word " * 600]}, ["602 tokens"]),
])
def test_well_formed_requests_the_model_cannot_take_get_a_400(client, body, words):
    res = post(client, **body)
    assert res.status_code == 400, res.text
    assert all(w in res.json()["detail"] for w in words), res.json()["detail"]


@pytest.mark.needs("torch", "transformers")
def test_an_encoder_decoders_rollout_is_its_encoders(seq2seq_app, tiny_seq2seq_dir):
    from fastapi.testclient import TestClient

    from attnlab.hf.capture import capture

    pair = "I sat on the bank of the river.\tThe river runs past the bank."
    maps = capture([pair], tiny_seq2seq_dir)
    with TestClient(seq2seq_app, base_url="http://127.0.0.1") as t5:
        for level, m in (("token", maps), ("word", maps.to_words())):
            body = t5.post("/api/rollout", json={"sentences": [pair], "level": level, "layer": 1, "residual": 0.2}).json()
            assert body["labels"] == (m.words if level == "word" else m.tokens)[0]  # the source's
            np.testing.assert_allclose(body["weights"], attnlab.rollout(m, 0.2)[0][1], atol=1e-6)
        res = t5.post("/api/rollout", json={"sentences": ["no tab"], "layer": 0})
        assert res.status_code == 400 and "one tab" in res.json()["detail"]
    data = rv.page_rollout(maps)
    t = len(maps.tokens[0])
    np.testing.assert_allclose(unpack(data["sentences"][0]["rollout"], (2, t, t)), attnlab.rollout(maps)[0], atol=1 / 65535)
