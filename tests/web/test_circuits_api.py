"""/api/patch and /api/attribute: on a served decoder the heads' values are the library's (attnlab.patch
and attnlab.logit_attribution called here with a metric written here); what the model cannot take is a
400 in the CLI's words, a malformed request a 422, an encoder's viewer a 400 with the reason, which
/api/info says first."""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from circuit_models import ids_of, one_id

CLEAN, CORRUPTED, TARGET, BASELINE = "Set the class of the", "Set the file of the", " class", " file"


@pytest.fixture(scope="module")
def decoder_client():
    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    with TestClient(create_app("attnlab:decoder"), base_url="http://127.0.0.1") as c:
        yield c


def test_info_says_an_encoder_cannot_patch_and_its_requests_are_400s(client):
    assert "bert encoder" in client.get("/api/info").json()["circuits"]["refusal"]
    for path, body in (("/api/patch", {"clean": "a b", "corrupted": "a c", "target": " b"}),
                       ("/api/attribute", {"text": "a b", "target": " b"})):
        r = client.post(path, json=body)
        assert r.status_code == 400 and "has no next-token logits for patching or attribution" in r.json()["detail"]


@pytest.mark.needs("torch", "transformers", "fastapi")
def test_patch_answers_the_librarys_effect_per_head(decoder_client, decoder):
    assert decoder_client.get("/api/info").json()["circuits"] == {"refusal": None}
    r = decoder_client.post("/api/patch", json={"clean": CLEAN, "corrupted": CORRUPTED, "target": TARGET,
                                                "baseline": BASELINE})
    assert r.status_code == 200, r.text
    got = r.json()
    t, b = one_id(decoder, TARGET), one_id(decoder, BASELINE)
    want = attnlab.patch(decoder, ids_of(decoder, CLEAN), ids_of(decoder, CORRUPTED),
                         lambda logits: logits[:, -1, t] - logits[:, -1, b])
    np.testing.assert_allclose(got["heads"], want.effect, rtol=0, atol=1e-12)
    assert (got["target"], got["baseline"], got["clean"]) == (t, b, float(want.clean[0]))
    assert got["metric"] == "logit difference ' class' − ' file'" and got["corrupted_labels"][3] == " file"


@pytest.mark.needs("torch", "transformers", "fastapi")
def test_attribute_answers_each_heads_direct_contribution_and_the_sum(decoder_client, decoder):
    got = decoder_client.post("/api/attribute", json={"text": CLEAN, "target": TARGET}).json()
    want = attnlab.logit_attribution(decoder, ids_of(decoder, CLEAN), one_id(decoder, TARGET))
    by_head = {c: v for c, v in zip(want.components, want.values) if isinstance(c, attnlab.Head)}
    assert got["heads"] == [[by_head[attnlab.Head(l, h)] for h in range(4)] for l in range(4)]
    assert [c["value"] for c in got["components"]] == want.values.tolist()
    assert got["total"] == pytest.approx(got["logit"], abs=1e-5) and got["error"] == want.error


@pytest.mark.needs("torch", "transformers", "fastapi")
@pytest.mark.parametrize("path, body, words", [
    ("/api/patch", {"clean": CLEAN, "corrupted": "Set the file", "target": TARGET},
     "clean has 6 tokens and corrupted has 4"),
    ("/api/patch", {"clean": CLEAN, "corrupted": CORRUPTED, "target": " Paris"},
     "target must be one token, got ' Paris', which is 3 tokens"),
    ("/api/patch", {"clean": CLEAN, "corrupted": CLEAN, "target": TARGET}, "clean and corrupted are the same text"),
    ("/api/attribute", {"text": CLEAN, "target": TARGET, "baseline": TARGET}, "baseline ' class' is the same token"),
    ("/api/attribute", {"text": "word " * 200, "target": TARGET}, "text has 400 tokens; this model takes at most 128"),
])
def test_what_the_decoder_cannot_take_is_a_400_in_words(decoder_client, path, body, words):
    r = decoder_client.post(path, json=body)
    assert r.status_code == 400 and words in r.json()["detail"], r.text


@pytest.mark.parametrize("path, body, field", [
    ("/api/patch", {"clean": "a", "corrupted": "b"}, "target"),
    ("/api/patch", {"clean": "", "corrupted": "b", "target": " a"}, "clean"),
    ("/api/patch", {"clean": "a", "corrupted": "b", "target": ""}, "target"),
    ("/api/patch", {"clean": "a", "corrupted": "b", "target": " a", "over": "head"}, "over"),
    ("/api/attribute", {"text": "a", "target": 3}, "target"),
    ("/api/attribute", {"text": "a" * 4001, "target": " a"}, "text"),
])
def test_malformed_circuit_requests_are_422_naming_the_field(client, path, body, field):
    r = client.post(path, json=body)
    assert r.status_code == 422 and field in r.text, r.text
