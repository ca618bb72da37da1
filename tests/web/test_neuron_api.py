"""The viewer's /api/neuron: one head's queries and keys equal capture(qk=True)'s, softmax of their
scaled dot products equals the head's map (/api/head), and bad input gets a clear 4xx, never a 500."""

from __future__ import annotations

import numpy as np
import pytest

BANK = ["I sat on the bank of the river.", "I put the money in the bank."]


def softmax_rows(q: np.ndarray, k: np.ndarray, meta: dict, bias: np.ndarray | None = None) -> np.ndarray:
    """softmax(softcap(q·kᵀ · scale) + bias + mask) by hand, float64: q [Tq, D], k [Tk, D] → [Tq, Tk]."""
    s = q.astype(np.float64) @ k.astype(np.float64).T * meta["scale"]
    if meta["softcap"] is not None:
        s = meta["softcap"] * np.tanh(s / meta["softcap"])
    if bias is not None:
        s = s + bias
    i, j = np.arange(s.shape[0])[:, None], np.arange(s.shape[1])[None, :]
    allowed = np.ones(s.shape, dtype=bool)
    if meta["causal"]:
        allowed &= j <= i
    if meta["window"] is not None:
        allowed &= (j >= i - meta["window"][0]) & (j <= i + meta["window"][1])
    s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def bank_qk(default_model):
    from attnlab.hf.capture import capture

    return capture(BANK, default_model, qk=True)


def test_one_heads_queries_and_keys_equal_capture_and_give_its_map(client, bank_qk):
    layer, head, sentence = 2, 10, 1  # 0-based: L3H11
    res = client.post("/api/neuron", json={"sentences": BANK, "sentence": sentence, "layer": layer, "head": head})
    assert res.status_code == 200, res.text
    body = res.json()
    assert (body["sentence"], body["layer"], body["head"], body["attention"]) == (sentence, layer, head, "encoder")
    assert body["labels"] == body["key_labels"] == bank_qk.tokens[sentence]
    q, k = np.array(body["q"]), np.array(body["k"])
    np.testing.assert_allclose(q, bank_qk.self_attention.queries[sentence][layer, head], atol=1e-5)  # 5 decimals
    np.testing.assert_allclose(k, bank_qk.self_attention.keys[sentence][layer, head], atol=1e-5)
    meta = bank_qk.self_attention.layers[layer].to_dict()
    assert body["meta"] == meta and body["bias"] is None and meta["scale"] == pytest.approx(32 ** -0.5)
    # The weights they make are the head view's, for every row.
    shown = client.post("/api/head", json={"sentences": BANK, "level": "token", "sentence": sentence,
                                           "layer": layer, "head": head}).json()
    np.testing.assert_allclose(softmax_rows(q, k, body["meta"]), np.array(shown["weights"]), atol=1e-4)
    np.testing.assert_allclose(softmax_rows(q, k, body["meta"]), bank_qk.weights[sentence][layer, head],
                               atol=1e-4)


def test_the_qk_capture_is_cached_and_counted_in_bytes(viewer_app, client):
    sentences = ["The cache keeps queries and keys."]
    for head in (0, 1):
        assert client.post("/api/neuron", json={"sentences": sentences, "layer": 0, "head": head}).status_code == 200
    cache = viewer_app.state.cache
    maps, size = cache.entries[("qk", tuple(sentences))]
    own = maps.self_attention
    want = sum(a.nbytes for xs in (own.weights, own.queries, own.keys) for a in xs)
    assert size == want and size > sum(w.nbytes for w in maps.weights)


def test_sentences_longer_than_a_pages_limit_are_served(client):
    from attnlab.viz.neuron import NEURON_MAX_TOKENS

    long = "the river runs past the bank " * 30  # 182 tokens, over the embedded page's limit
    body = client.post("/api/neuron", json={"sentences": [long], "layer": 5, "head": 11}).json()
    assert len(body["labels"]) > NEURON_MAX_TOKENS and np.array(body["q"]).shape == (len(body["labels"]), 32)


@pytest.mark.parametrize("body, words", [
    ({"sentences": BANK, "layer": 6, "head": 0}, ["layer", "0..5", "6"]),
    ({"sentences": BANK, "layer": 0, "head": 12}, ["head", "0..11", "12"]),
    ({"sentences": BANK[:1], "sentence": 1, "layer": 0, "head": 0}, ["sentence", "0..0"]),
    ({"sentences": BANK, "layer": 0, "head": 0, "attention": "cross"}, ["cross", "not an encoder–decoder"]),
    ({"sentences": ["word " * 600], "layer": 0, "head": 0}, ["tokens", "512"]),
])
def test_what_the_model_cannot_take_gets_400_with_a_message(client, body, words):
    res = client.post("/api/neuron", json=body)
    assert res.status_code == 400, res.text
    for w in words:
        assert w in res.json()["detail"]


@pytest.mark.parametrize("body, field", [
    ({"sentences": BANK, "layer": "3", "head": 0}, "layer"),        # a string, not an int
    ({"sentences": BANK, "layer": -1, "head": 0}, "layer"),         # 0-based
    ({"sentences": BANK, "head": 0}, "layer"),                      # missing
    ({"sentences": BANK, "layer": 0, "head": 0, "attention": "side"}, "attention"),
    ({"sentences": BANK, "layer": 0, "head": 0, "level": "word"}, "level"),  # token level only: not a field
    ({"sentences": [], "layer": 0, "head": 0}, "sentences"),
])
def test_malformed_neuron_requests_get_422_naming_the_field(client, body, field):
    res = client.post("/api/neuron", json=body)
    assert res.status_code == 422, res.text
    assert any(field in map(str, e["loc"]) for e in res.json()["detail"])
