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
    ({"prompt": "x", "cache": "dense"}, "cache"),
])
def test_malformed_requests_are_422(client, body, word):
    r = client.post("/api/generate", json=body)
    assert r.status_code == 422 and word in r.text, r.text
