"""Fuzz the viewer's API against its own OpenAPI schema (schemathesis): no input gets a 5xx, every
status is one the schema documents, every 2xx body matches its schema. Valid and invalid bodies,
bounded in count. The app runs on a tiny random BERT (the real loading and capturing code) so the
run stays a few seconds."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
OPERATIONS = [("POST", "/api/maps"), ("POST", "/api/head"), ("POST", "/api/roles"), ("POST", "/api/find-head"),
              ("GET", "/api/info"), ("GET", "/api/scene")]
EXAMPLES = 15  # per operation and mode


@pytest.fixture(scope="module")
def tiny_schema(tiny_model_dir):
    from attnlab.viz.server import create_app

    return schemathesis.openapi.from_asgi("/openapi.json", create_app(str(tiny_model_dir)))


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
