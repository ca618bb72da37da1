"""/api/generate's refusals: malformed requests are 422s that say what is wrong, an encoder's viewer a
400 with the reason (and /api/info says it first); never a 500."""

from __future__ import annotations

import pytest


def test_info_says_an_encoder_cannot_generate(client):
    got = client.get("/api/info").json()["generate"]
    assert "bert encoder" in got["refusal"] and got["max_new_tokens"] == 128


def test_an_encoder_is_a_400(client):
    r = client.post("/api/generate", json={"prompt": "The bank", "max_new_tokens": 4})
    assert r.status_code == 400 and "does not generate" in r.json()["detail"]


@pytest.mark.parametrize("body, word", [
    ({"prompt": "", "max_new_tokens": 4}, "prompt"),
    ({"prompt": "x", "max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt": "x", "max_new_tokens": 129}, "max_new_tokens"),
    ({"prompt": "x", "temperature": 0}, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": 0}, "top_k"),
    ({"prompt": "x", "max_new_tokens": "4"}, "max_new_tokens"),
    ({"prompt": "x", "cache": "ring"}, "cache"),
    ({"prompt": "x", "window": 0}, "window"),
    ({"prompt": "x", "cache": "sink", "sink": 0}, "sink"),
])
def test_malformed_requests_are_422(client, body, word):
    r = client.post("/api/generate", json=body)
    assert r.status_code == 422 and word in r.text, r.text


@pytest.mark.parametrize("body", [{"prompt": "x", "temperature": 1e9}, {"prompt": "x", "temperature": 0},
                                  {"prompt": "x", "temperature": -2.5}])
def test_a_temperature_out_of_range_is_the_librarys_sentence(client, body):
    from attnlab.transformer.sampling import TEMPERATURE_RULE

    r = client.post("/api/generate", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["msg"].startswith(TEMPERATURE_RULE), r.text
    assert TEMPERATURE_RULE == "temperature must be a finite number in (0, 100]"


def test_a_prompt_of_spaces_is_said_in_words(client):
    r = client.post("/api/generate", json={"prompt": " \t\n ", "max_new_tokens": 4})
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"] == "prompt: is only spaces; type some text.", r.text
    assert "should match pattern" not in r.text


@pytest.fixture(scope="module")
def decoder_client():
    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    with TestClient(create_app("attnlab:decoder"), base_url="http://127.0.0.1") as c:
        yield c


def test_the_cache_field_is_the_librarys(decoder_client):
    """cache/window/sink reach the library's generate: a sink cache goes past the bundled decoder's 128
    positions, where a dense one is a 400 in the library's words; a sink without its window is a 400 too."""
    from attnlab.transformer import DEFAULT_DECODER, Transformer

    body = {"prompt": "Return the number of", "max_new_tokens": 128}
    dense = decoder_client.post("/api/generate", json=body)
    assert dense.status_code == 400 and "passes the model's 128 positions" in dense.json()["detail"], dense.text
    sink = decoder_client.post("/api/generate", json={**body, "cache": "sink", "window": 16, "sink": 2})
    assert sink.status_code == 200, sink.text
    ours = Transformer.from_pretrained(DEFAULT_DECODER).generate(body["prompt"], 128, cache="sink", window=16, sink=2)
    assert [s["token"] for s in sink.json()["steps"]] == ours.ids[0, : int(ours.lengths[0])].tolist()
    no_window = decoder_client.post("/api/generate", json={**body, "cache": "sink"})
    assert no_window.status_code == 400 and "needs window=" in no_window.json()["detail"], no_window.text
