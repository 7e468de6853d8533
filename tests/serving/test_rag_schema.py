"""/v1/rag in the OpenAPI document: named request/response/error schemas with examples, and served answers (tiny
models, every method) valid under the published schema, so the document cannot drift from what is returned."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from specrag_jax.serving.app import create_app
from specrag_jax.serving.rag_schemas import RagRequest
from tests.serving.conftest import DOCS
from tests.serving.rag_schema_check import assert_follows_rag_schema, schema_validator

ERRORS = ("400", "401", "413", "429", "500", "503", "504")


@pytest.fixture
def client(make_service):
    with TestClient(create_app(make_service())) as c:
        c.openapi = c.get("/openapi.json").json()
        yield c


def _operation(openapi: dict) -> dict:
    return openapi["paths"]["/v1/rag"]["post"]


def test_openapi_names_the_schemas_and_holds_valid_examples(make_service):
    openapi = create_app(make_service()).openapi()
    op = _operation(openapi)
    body = op["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/RagRequest"}
    request = schema_validator(openapi, "RagRequest")
    assert len(body["examples"]) >= 1
    for example in body["examples"].values():
        assert request.is_valid(example["value"]), example
        RagRequest.model_validate(example["value"])  # the endpoint accepts it too
    fields = openapi["components"]["schemas"]["RagRequest"]["properties"]
    assert set(fields) == set(RagRequest.model_fields) and all("description" in f for f in fields.values())

    ok = op["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/RagResponse"}
    examples = [e["value"] for e in ok["application/json"]["examples"].values()]
    assert examples and all(e["drafts"] and e["citations"] and e["rationale"] is not None for e in examples)
    for example in examples:
        assert_follows_rag_schema(openapi, example)
    events = [line[6:] for line in ok["text/event-stream"]["example"].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["event"] == "result"
    assert_follows_rag_schema(openapi, {k: v for k, v in json.loads(events[-2]).items() if k != "event"})
    schemas = openapi["components"]["schemas"]
    for name in ("RagResponse", "RagDraft", "RagTrace"):
        assert all("description" in f for f in schemas[name]["properties"].values()), name

    error = schema_validator(openapi, "ErrorResponse")
    assert "422" not in op["responses"]  # validation errors are 400s here
    for status in ERRORS:
        content = op["responses"][status]["content"]["application/json"]
        assert content["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}, status
        assert error.is_valid(content["example"]), status


def test_served_answers_follow_the_published_schema(client):
    openapi = client.openapi
    example = _operation(openapi)["requestBody"]["content"]["application/json"]["examples"]["documents"]["value"]
    bodies = [
        example,
        {"question": "capital of France?", "documents": DOCS, "m": 2, "selection": "rho", "tau_min": 1.0}
        | {"method": "speculative"},
    ]  # plain verification, then the fallback
    bodies += [
        {"question": "capital of Italy?", "documents": DOCS[2:], "method": m}
        for m in ("standard", "closed_book", "drafter_only", "random_draft", "lossless", "auto")
    ]
    bodies.append({"question": "capital of Germany?", "m": 2})  # corpus search
    paths = set()
    for body in bodies:
        r = client.post("/v1/rag", json=body)
        assert r.status_code == 200, r.text
        assert_follows_rag_schema(openapi, r.json())
        paths.add(r.json()["trace"].get("path"))
    assert "fallback" in paths
    with client.stream(
        "POST", "/v1/rag", json={"question": "capital of Italy?", "documents": DOCS[:2], "stream": True, "m": 2}
    ) as s:
        events = [line[6:] for line in s.read().decode().splitlines() if line.startswith("data: ")]
    result = json.loads(events[-2])
    assert result.pop("event") == "result"
    assert_follows_rag_schema(openapi, result)
    error = schema_validator(openapi, "ErrorResponse")
    for body in ({"question": ""}, {"question": "q", "bogus": 1}, {"question": "q", "m": 0}):
        r = client.post("/v1/rag", json=body)
        assert r.status_code == 400 and error.is_valid(r.json()), r.text
