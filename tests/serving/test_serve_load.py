"""benchmarks/serve_load.py helpers (the full run is a benchmark, not a test)."""

from __future__ import annotations

from benchmarks.serve_load import UNIQUE_QUESTIONS, _summary, completion_body, rag_body
from specrag_jax.serving.rag_schemas import RagRequest
from specrag_jax.serving.schemas import ChatCompletionRequest


def test_rag_bodies_follow_the_endpoint_contract():
    bodies = [rag_body(i, 3, 2) for i in range(UNIQUE_QUESTIONS)]
    for b in bodies:
        RagRequest(**b)  # unknown fields would raise
        assert len(b["documents"]) == 6 and len({d["id"] for d in b["documents"]}) == 6
    assert len({b["question"] for b in bodies}) == UNIQUE_QUESTIONS  # measured runs never share a question
    assert rag_body(5, 3, 2) == rag_body(5, 3, 2)  # deterministic


def test_summary_percentiles_and_errors():
    s = _summary([float(i) for i in range(1, 21)] + [9.0], [200] * 20 + [429], wall=10.0, tokens=500)
    assert s["ok"] == 20 and s["errors"] == {"429": 1}
    assert s["latency_s"]["p50"] == 11.0 and s["latency_s"]["p95"] == 20.0
    assert s["requests_per_s"] == 2.0 and s["tokens_per_s"] == 50.0


def test_chat_bodies_with_and_without_the_sampling_extras_are_valid():
    plain, extras = (
        ChatCompletionRequest(**completion_body(3, 16)),
        ChatCompletionRequest(**completion_body(3, 16, True)),
    )
    assert not plain.logprobs and extras.logprobs and extras.top_n() == 5 and extras.repetition_penalty == 1.1
    assert plain.messages == extras.messages and plain.token_limit() == extras.token_limit() == 16
