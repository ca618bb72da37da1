"""`attnlab serve` of an encoder–decoder (a tiny T5 built in the test): a sentence is a
source<TAB>target pair, /api/maps announces the decoder and cross-attention, and /api/head serves
each kind's map equal to capture's, at the level it says; bad input gets a 4xx naming the problem."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.needs("torch", "transformers", "fastapi")

PAIR = "I sat on the bank of the river.\tThe river runs past the bank, slowly!"
OTHER = "The money!\tI put it in the bank."


@pytest.fixture(scope="module")
def t5(seq2seq_app):
    from fastapi.testclient import TestClient

    with TestClient(seq2seq_app, base_url="http://127.0.0.1") as c:
        yield c


@pytest.fixture(scope="module")
def captured(tiny_seq2seq_dir):
    from attnlab.hf.capture import capture

    maps = capture([PAIR, OTHER], tiny_seq2seq_dir)
    return maps, maps.to_words()


def test_info_says_the_model_takes_pairs(t5, client):
    assert t5.get("/api/info").json()["encoder_decoder"] is True
    assert client.get("/api/info").json()["encoder_decoder"] is False


@pytest.mark.parametrize("level", ["token", "word"])
def test_maps_announce_the_decoder_and_cross_attention(t5, captured, level):
    maps, words = captured
    body = t5.post("/api/maps", json={"sentences": [PAIR, OTHER], "level": level}).json()
    s2s = body["seq2seq"]
    assert s2s["model"] == {"num_layers": 3, "num_heads": 4} and body["model"]["num_layers"] == 2
    word_level = s2s["level"] == "word"
    assert word_level == (level == "word" and getattr(words, "decoder", None) is not None)
    for i, s in enumerate(s2s["sentences"]):
        if word_level:
            assert s["source"] == words.words[i] and s["target"] == words.decoder.words[i]
            assert s["target_is_mark"] == words.decoder.is_mark[i]
        else:
            assert s["source"] == maps.tokens[i] and s["target"] == maps.decoder.tokens[i]
            dec_words = maps.decoder.to_words()
            assert s["target_is_mark"] == [dec_words.is_mark[i][w] for w in maps.decoder.word_of[i]]
        assert len(s["source_is_mark"]) == len(s["source"]) and s["source_is_mark"][-1]  # </s> is a mark
        assert s["target"][0] == "<pad>"  # T5's decoder starts from its pad token
    assert body["sentences"][0]["labels"] == (words.words[0] if level == "word" else maps.tokens[0])


@pytest.mark.parametrize("kind", ["encoder", "decoder", "cross"])
@pytest.mark.parametrize("level", ["token", "word"])
def test_each_kinds_head_is_captures_map(t5, captured, kind, level):
    maps, words = captured
    layer, head, sentence = 2, 3, 1
    res = t5.post("/api/head", json={"sentences": [PAIR, OTHER], "level": level, "sentence": sentence,
                                     "layer": layer, "head": head, "kind": kind})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["kind"] == kind
    m = words if body["level"] == "word" else maps
    if kind == "encoder":
        assert body["level"] == level
        want, rows, cols = m.weights[sentence], m, m
    else:
        assert body["level"] in (level, "token")  # word level where the word maps keep the decoder's
        want = (m.decoder.weights if kind == "decoder" else m.cross_weights)[sentence]
        rows, cols = m.decoder, (m.decoder if kind == "decoder" else m)
    label = (lambda x: x.words[sentence]) if body["level"] == "word" else (lambda x: x.tokens[sentence])
    assert body["labels"] == label(rows) and body["key_labels"] == label(cols)
    np.testing.assert_allclose(body["weights"], want[layer - 1, head - 1], atol=1e-6)
    if kind == "decoder":
        assert np.all(np.triu(np.array(body["weights"]), k=1) == 0)  # causal


@pytest.mark.parametrize("body, words", [
    ({"sentences": ["Only a source."]}, ["sentences[0] has 0 tabs", "encoder–decoder", "one tab"]),
    ({"sentences": [PAIR, "a\tb\tc"]}, ["sentences[1] has 2 tabs"]),
    ({"sentences": [PAIR], "layer": 4, "head": 1, "kind": "cross"}, ["layer of the cross attention", "1..3", "4"]),
    ({"sentences": [PAIR], "layer": 3, "head": 5, "kind": "decoder"}, ["head of the decoder attention", "1..4"]),
    ({"sentences": [PAIR], "layer": 3, "head": 1, "kind": "encoder"}, ["layer must be 1..2"]),
])
def test_what_the_encoder_decoder_cannot_take_gets_400(t5, body, words):
    path = "/api/head" if "layer" in body else "/api/maps"
    res = t5.post(path, json=body)
    assert res.status_code == 400, res.text
    for w in words:
        assert w in res.json()["detail"]


def test_an_encoder_has_no_decoder_or_cross_kind(client):
    res = client.post("/api/head", json={"sentences": ["I sat."], "layer": 1, "head": 1, "kind": "decoder"})
    assert res.status_code == 400 and "not an encoder–decoder" in res.json()["detail"]
    assert client.post("/api/head", json={"sentences": ["I sat."], "layer": 1, "head": 1, "kind": "both"}).status_code == 422
    body = client.post("/api/maps", json={"sentences": ["I sat."]}).json()
    assert body.get("seq2seq") is None
