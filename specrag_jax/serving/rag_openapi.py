"""What the OpenAPI document says of /v1/rag beyond its schemas: request and response examples, the streamed
form and the errors. The examples are a real answer's shape (SmolLM2-135M drafts, Qwen2.5-Coder-1.5B verifies,
CPython's help topics as documents); the schema test validates each against the published schemas."""

from __future__ import annotations

import copy

from specrag_jax.serving.rag_schemas import ErrorResponse, RagResponse
from specrag_jax.serving.sse import sse

DOCUMENTS = [
    {
        "id": "break",
        "title": "The break statement",
        "text": "break may only occur syntactically nested in a for or "
        "while loop, but not nested in a function or class definition within that loop. It terminates the nearest "
        "enclosing loop, skipping the optional else clause if the loop has one.",
    },
    {
        "id": "continue",
        "title": "The continue statement",
        "text": "continue may only occur syntactically nested in a "
        "for or while loop. It continues with the next cycle of the nearest enclosing loop.",
    },
    {
        "id": "for",
        "title": "The for statement",
        "text": "The for statement is used to iterate over the elements of a "
        "sequence (such as a string, tuple or list) or other iterable object.",
    },
    {
        "id": "while",
        "title": "The while statement",
        "text": "The while statement is used for repeated execution as long as an expression is true.",
    },
]

REQUEST_EXAMPLES = {
    "documents": {
        "summary": "Speculative RAG over given passages",
        "value": {"question": "How do I leave a loop early in Python?", "documents": DOCUMENTS, "m": 2, "k": 2},
    },
    "corpus": {
        "summary": "The server's corpus, the server's reranker and a stricter cascade",
        "value": {
            "question": "What does the with statement do?",
            "rerank": "kv",
            "n_coarse": 20,
            "m": 5,
            "k": 2,
            "selection": "evidence",
            "tau_min": 0.6,
        },
    },
    "stream": {
        "summary": "Standard RAG over plain-text passages, streamed",
        "value": {
            "question": "Which statement skips to the next loop cycle?",
            "method": "standard",
            "stream": True,
            "documents": [
                "continue goes on with the next cycle of the nearest enclosing loop.",
                "break terminates the nearest enclosing loop.",
            ],
        },
    },
}


def _draft(index: int, doc_ids: list[str], rationale: str, scores: tuple[float, ...], tokens: int) -> dict:
    draft_lp, ev_sc, ev_yes, ev_no, score = scores
    answer = "The `break` statement."
    return {
        "index": index,
        "doc_ids": doc_ids,
        "text": f"## Rationale: {rationale}\n## Response: {answer}",
        "rationale": rationale,
        "answer": answer,
        "parsed": True,
        "draft_logprob": draft_lp,
        "draft_tokens": tokens,
        "sc_logprob": 0.0,
        "sc_tokens": 0,
        "sr_logprob": 0.0,
        "sr_no_logprob": 0.0,
        "ev_sc_logprob": ev_sc,
        "ev_sc_tokens": tokens,
        "ev_sr_logprob": ev_yes,
        "ev_sr_no_logprob": ev_no,
        "score": score,
    }


_RATIONALE = "The break statement terminates the nearest enclosing for or while loop, skipping the loop's else clause."
VERIFIED_ANSWER = {
    "answer": "The `break` statement.",
    "rationale": _RATIONALE,
    "citations": ["break", "for"],
    "drafts": [
        _draft(0, ["break", "for"], _RATIONALE, (-9.8312, -21.5406, -0.1203, -2.4011, -0.0975), 31),
        _draft(
            1,
            ["break", "while"],
            "Inside a while loop, break ends the loop at once; its else clause does not run.",
            (-12.0457, -25.0183, -0.3511, -1.6017, -0.2522),
            29,
        ),
    ],
    "trace": {
        "notes": [],
        "documents": ["break", "continue", "for", "while"],
        "retrieval_s": 0.0,
        "compile_s": 0.0,
        "clustering_s": 0.412,
        "num_subsets": 2,
        "clusters": 2,
        "cluster_sizes": [2, 2],
        "clustering_tokens": 412,
        "clustering_steps": 1,
        "clustering_question_tokens": 12,
        "clustering_docs": 4,
        "drafting_s": 3.871,
        "drafter_prefill_tokens": 402,
        "drafter_shared_prefix_tokens": 118,
        "drafter_decode_tokens": 60,
        "drafter_decode_steps": 31,
        "drafter_first_token_s": 0.612,
        "parsed_drafts": 2,
        "first_draft_token_s": 1.031,
        "evidence_verification_s": 2.954,
        "evidence_prefix_tokens": 64,
        "evidence_tree_tokens": 452,
        "evidence_scored_rows": 62,
        "evidence_prefix_cached_tokens": 48,
        "confidence": 0.8421,
        "selection": "evidence",
        "chosen_draft": 0,
        "path": "verified_draft",
        "total_s": 7.243,
    },
    "method": "speculative",
}


def _fallback_answer() -> dict:
    """The same drafts under ``tau_min`` 0.9: the verifier answers from all passages through the lossless path."""
    out = copy.deepcopy(VERIFIED_ANSWER)
    out.update(
        answer="Use the break statement; it ends the nearest enclosing loop.",
        rationale="",
        citations=["break", "continue", "for", "while"],
    )
    trace = out["trace"]
    trace.update(fallback="standard", path="fallback")
    trace.pop("total_s")
    trace.update(
        generation_s=4.106,
        verifier_prefill_tokens=311,
        verifier_decode_tokens=14,
        verifier_decode_s=3.2,
        speculation={
            "counts": {"steps": 6, "proposed": 58, "accepted": 8, "emitted": 14, "histogram": {"1": 2, "2": 2, "4": 2}},
            "steps": 6,
            "accepted_tokens_per_step": 2.3333,
            "proposed_tokens_per_step": 9.6667,
            "draft_tokens_accepted_per_step": 1.3333,
            "tokens_per_step_histogram": {"1": 2, "2": 2, "4": 2},
        },
        total_s=11.349,
    )
    return out


RESPONSE_EXAMPLES = {
    "verified_draft": {"summary": "A draft verified and accepted (confidence >= tau_min)", "value": VERIFIED_ANSWER},
    "fallback": {
        "summary": "Confidence under tau_min (0.9 here): the verifier's own answer (lossless fallback)",
        "value": _fallback_answer(),
    },
}

STREAM_EXAMPLE = b"".join(
    sse(e)
    for e in [
        {"event": "stage", "stage": "retrieval"},
        {"event": "stage", "stage": "drafter_generate", "branches": 2, "phases": 2},
        {"event": "stage", "stage": "verifier_score", "tree_tokens": 452},
        {"event": "result", **VERIFIED_ANSWER},
        "[DONE]",
    ]
).decode()


def _error(description: str, message: str, kind: str) -> dict:
    return {
        "model": ErrorResponse,
        "description": description,
        "content": {"application/json": {"example": {"error": {"message": message, "type": kind}}}},
    }


RAG_RESPONSES: dict[int | str, dict] = {
    200: {
        "model": RagResponse,
        "description": "The answer (JSON), or with `stream: true` server-sent events: "
        "`stage` events as the pipeline reaches each engine, then one `result` event (the JSON answer with "
        '`"event": "result"`) and `[DONE]`; a failure mid-stream is an `error` event {event, message, type}.',
        "content": {
            "application/json": {"examples": RESPONSE_EXAMPLES},
            "text/event-stream": {"schema": {"type": "string"}, "example": STREAM_EXAMPLE},
        },
    },
    400: _error(
        "Malformed JSON, an unknown field, an invalid value (named), or a question the server cannot "
        "answer (no documents and no corpus, a prompt too long for the context)",
        "m: Input should be greater than or equal to 1",
        "invalid_request_error",
    ),
    401: _error(
        "The API key is missing or wrong (when the server has one)", "missing or wrong API key", "invalid_request_error"
    ),
    413: _error("The body is over --max-body-bytes", "request body over 1048576 bytes", "request_too_large"),
    429: _error(
        "Too busy: too many requests in flight (Retry-After: 1), or an engine's queue is full",
        "server busy: too many requests in flight",
        "invalid_request_error",
    ),
    "4XX": _error("Any other client error, in the same shape", "Not Found", "invalid_request_error"),
    500: _error("An engine step failed", "engine step failed: ...", "server_error"),
    503: _error(
        "The server is shutting down (Retry-After: 5)", "engine drafter is not accepting requests", "unavailable"
    ),
    504: _error("Past --request-timeout", "request timed out", "timeout"),
}
