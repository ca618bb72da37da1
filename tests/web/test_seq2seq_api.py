"""`attnlab serve` of an encoder–decoder (a tiny T5 built in the test): a sentence is a
source<TAB>target pair, /api/maps announces the decoder and cross-attention, and /api/head serves
each attention's map equal to capture's, at the level it says; bad input gets a 4xx naming the problem."""

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
    assert word_level == (level == "word" and words.is_seq2seq)
    for i, s in enumerate(s2s["sentences"]):
        if word_level:
            assert s["source"] == words.words[i] and s["target"] == words.target.words[i]
            assert s["target_is_mark"] == words.target.is_mark[i]
        else:
            assert s["source"] == maps.tokens[i] and s["target"] == maps.target.tokens[i]
            assert s["target_is_mark"] == [words.target.is_mark[i][w] for w in maps.target.word_of[i]]
        assert len(s["source_is_mark"]) == len(s["source"]) and s["source_is_mark"][-1]  # </s> is a mark
        assert s["target"][0] == "<pad>"  # T5's decoder starts from its pad token
    assert body["sentences"][0]["labels"] == (words.words[0] if level == "word" else maps.tokens[0])


@pytest.mark.parametrize("attention", ["encoder", "decoder", "cross"])
@pytest.mark.parametrize("level", ["token", "word"])
def test_each_attentions_head_is_captures_map(t5, captured, attention, level):
    maps, words = captured
    layer, head, sentence = 1, 2, 1  # 0-based
    res = t5.post("/api/head", json={"sentences": [PAIR, OTHER], "level": level, "sentence": sentence,
                                     "layer": layer, "head": head, "attention": attention})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["attention"] == attention
    m = words if body["level"] == "word" else maps
    assert body["level"] == level  # every record has both levels
    if attention == "encoder":
        want, rows, cols = m.weights[sentence], m.source, m.source
    else:
        want = (m.decoder if attention == "decoder" else m.cross).weights[sentence]
        rows, cols = m.target, (m.target if attention == "decoder" else m.source)
    assert body["labels"] == rows.labels(sentence) and body["key_labels"] == cols.labels(sentence)
    np.testing.assert_allclose(body["weights"], want[layer, head], atol=1e-6)
    if attention == "decoder":
        assert np.all(np.triu(np.array(body["weights"]), k=1) == 0)  # causal


@pytest.mark.parametrize("body, words", [
    ({"sentences": ["Only a source."]}, ["sentences[0] has 0 tabs", "encoder–decoder", "one tab"]),
    ({"sentences": [PAIR, "a\tb\tc"]}, ["sentences[1] has 2 tabs"]),
    ({"sentences": [PAIR], "layer": 3, "head": 0, "attention": "cross"}, ["layer of the cross attention", "0..2", "3"]),
    ({"sentences": [PAIR], "layer": 2, "head": 4, "attention": "decoder"}, ["head of the decoder attention", "0..3"]),
    ({"sentences": [PAIR], "layer": 2, "head": 0, "attention": "encoder"}, ["layer must be 0..1"]),
])
def test_what_the_encoder_decoder_cannot_take_gets_400(t5, body, words):
    path = "/api/head" if "layer" in body else "/api/maps"
    res = t5.post(path, json=body)
    assert res.status_code == 400, res.text
    for w in words:
        assert w in res.json()["detail"]


def test_an_encoder_has_no_decoder_or_cross_attention(client):
    res = client.post("/api/head", json={"sentences": ["I sat."], "layer": 0, "head": 0, "attention": "decoder"})
    assert res.status_code == 400 and "not an encoder–decoder" in res.json()["detail"]
    assert client.post("/api/head", json={"sentences": ["I sat."], "layer": 0, "head": 0, "attention": "both"}).status_code == 422
    body = client.post("/api/maps", json={"sentences": ["I sat."]}).json()
    assert body.get("seq2seq") is None
