"""Checks of /v1/rag answers against the schemas the app publishes in its OpenAPI document."""

from __future__ import annotations

import json

import jsonschema_rs


def schema_validator(openapi: dict, name: str) -> jsonschema_rs.Draft202012Validator:
    """A JSON Schema validator of ``components.schemas[name]`` in ``openapi`` (its references resolved there)."""
    return jsonschema_rs.Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": openapi["components"]}
    )


def assert_follows_rag_schema(openapi: dict, answer: dict) -> None:
    """``answer`` (a /v1/rag JSON answer) is valid under the published ``RagResponse``, and every key of its trace
    is one the schema describes (the trace object stays open to keys of plugged-in pipeline pieces)."""
    answer = json.loads(json.dumps(answer))  # as sent: integer dict keys become strings
    errors = [
        f"{'/'.join(map(str, e.instance_path))}: {e.message}"
        for e in schema_validator(openapi, "RagResponse").iter_errors(answer)
    ]
    assert not errors, errors
    documented = openapi["components"]["schemas"]["RagTrace"]["properties"]
    assert set(answer["trace"]) <= set(documented), sorted(set(answer["trace"]) - set(documented))
