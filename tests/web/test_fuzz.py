"""Fuzz the viewer's API against its own OpenAPI schema (schemathesis): no input gets a 5xx, every
status is one the schema documents, every 2xx body matches its schema. Valid and invalid bodies,
and valid bodies with a lone surrogate (``"\\ud800"``: valid JSON, not encodable as UTF-8; schemathesis
itself never sends one) in every string and as an extra key, bounded in count. The app runs on a tiny random BERT (the real loading and capturing code) so the
run stays a few seconds."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.needs("fastapi")  # every test runs the viewer's app

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
OPERATIONS = [("POST", "/api/maps"), ("POST", "/api/head"), ("POST", "/api/neuron"), ("POST", "/api/roles"),
              ("POST", "/api/rollout"),
              ("POST", "/api/find-head"), ("POST", "/api/generate"), ("POST", "/api/patch"), ("POST", "/api/attribute"),
              ("POST", "/api/long/info"), ("POST", "/api/long/overview"), ("POST", "/api/long/tile"),
              ("POST", "/api/long/row"), ("POST", "/api/long/column"),
              ("GET", "/api/info"), ("GET", "/api/scene")]
EXAMPLES = 15  # per operation and mode


@pytest.fixture(scope="module")
def tiny_app(tiny_model_dir):
    from attnlab.web.guard import allowed_hosts
    from attnlab.web.server import create_app

    # Schemathesis calls the app as "testserver"; the real server answers only to its own names.
    return create_app(str(tiny_model_dir), hosts={*allowed_hosts(), "testserver"})


@pytest.fixture(scope="module")
def tiny_schema(tiny_app):
    return schemathesis.openapi.from_asgi("/openapi.json", tiny_app)


def test_the_schema_lists_every_operation(tiny_schema):
    found = {(op.ok().method.upper(), op.ok().path) for op in tiny_schema.get_all_operations()}
    assert found == set(OPERATIONS)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize("method, path", OPERATIONS)
def test_no_input_gets_a_server_error(tiny_schema, method, path, mode):
    operation = tiny_schema[path][method]
    if mode is GenerationMode.NEGATIVE and method == "GET":
        pytest.skip(f"{method} {path} takes no input to make invalid")

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        case.call_and_validate(checks=CHECKS)

    run()


@pytest.mark.needs("torch", "transformers")
@pytest.mark.parametrize("path", ["/api/maps", "/api/head", "/api/neuron"])
def test_an_encoder_decoder_gets_no_server_error(tiny_seq2seq_dir, path):
    """The same checks on a tiny T5, each generated sentence made a source<TAB>target pair (half of
    them reversed, so that source and target differ in length), and most layers and heads brought
    into the model's range, so that every kind of attention is served, not only refused."""
    from attnlab.web.guard import allowed_hosts
    from attnlab.web.server import create_app

    app = create_app(str(tiny_seq2seq_dir), hosts={*allowed_hosts(), "testserver"})
    operation = schemathesis.openapi.from_asgi("/openapi.json", app)[path]["POST"]

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE), reverse=st.booleans())
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case, reverse):
        case.body["sentences"] = [s if "\t" in s else f"{s}\t{s[::-1] if reverse else s}" for s in case.body["sentences"]]
        for key, size in (("layer", 3), ("head", 4), ("sentence", len(case.body["sentences"]))):
            v = case.body.get(key)
            if type(v) in (int, float) and v == int(v) and v < 900:  # JSON's 2.0 is 2 to the schema
                case.body[key] = int(v) % size  # 0-based, as every field
        case.call_and_validate(checks=CHECKS)

    run()


def with_surrogate(value, char: str):
    """``value`` with ``char`` put in the middle of every string, and as an extra key of every object."""
    if isinstance(value, str):
        return value[: len(value) // 2] + char + value[len(value) // 2:]
    if isinstance(value, list):
        return [with_surrogate(v, char) for v in value]
    if isinstance(value, dict):
        return {**{k: with_surrogate(v, char) for k, v in value.items()}, f"x{char}": 1}
    return value


@pytest.mark.parametrize("method, path", [op for op in OPERATIONS if op[0] == "POST"])
def test_lone_surrogates_get_a_4xx_never_a_server_error(tiny_schema, tiny_app, method, path):
    """Schemathesis's valid bodies, each string given a lone surrogate; sent by a plain client, since
    schemathesis itself cannot hash such a body."""
    import json

    from fastapi.testclient import TestClient

    client = TestClient(tiny_app, base_url="http://127.0.0.1", raise_server_exceptions=False)
    operation = tiny_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
           char=st.characters(categories=["Cs"]), as_key=st.booleans())
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case, char, as_key):
        body = with_surrogate(case.body, char)
        if not as_key and isinstance(body, dict):
            body = {k: v for k, v in body.items() if not k.startswith("x")}
        res = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
        assert 400 <= res.status_code < 500, res.text
        detail = res.json()["detail"]
        assert detail and all(isinstance(e["msg"], str) and isinstance(e["loc"], list) for e in detail)

    run()


@pytest.mark.needs("torch", "transformers")
def test_a_decoder_gets_no_server_error_when_generating(tiny_folder):
    """/api/generate on a tiny Gemma-2 (a decoder), where it generates (valid bodies): every prompt,
    length and sampling option is served or refused with a documented status, never a 5xx."""
    from attnlab.web.guard import allowed_hosts
    from attnlab.web.server import create_app

    app = create_app(str(tiny_folder("gemma2")), hosts={*allowed_hosts(), "testserver"})
    operation = schemathesis.openapi.from_asgi("/openapi.json", app)["/api/generate"]["POST"]
    statuses = []

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        statuses.append(case.call_and_validate(checks=CHECKS).status_code)

    run()
    assert 200 in statuses, statuses  # it generated, not only refused


@pytest.mark.needs("torch", "transformers")
@pytest.mark.parametrize("path", ["/api/patch", "/api/attribute"])
def test_a_decoder_gets_no_server_error_when_patching_or_attributing(tiny_folder, path):
    """/api/patch and /api/attribute on a tiny Gemma-2 (a decoder): valid bodies, most of them made
    runnable (the target a one-token word, the corrupted text the clean one with its last character
    changed, usually as many tokens), are served or refused with a documented status, never a 5xx."""
    from attnlab.web.guard import allowed_hosts
    from attnlab.web.server import create_app

    app = create_app(str(tiny_folder("gemma2")), hosts={*allowed_hosts(), "testserver"})
    operation = schemathesis.openapi.from_asgi("/openapi.json", app)[path]["POST"]
    statuses = []

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE), runnable=st.booleans())
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case, runnable):
        if runnable:
            case.body["target"] = "the"
            if "clean" in case.body:
                clean = case.body["clean"]
                case.body["corrupted"] = clean[:-1] + ("b" if clean[-1] == "a" else "a")
        statuses.append(case.call_and_validate(checks=CHECKS).status_code)

    run()
    assert 200 in statuses, statuses  # it ran the tool, not only refused
