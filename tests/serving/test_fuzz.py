"""Property-based fuzz of the HTTP API from its own OpenAPI schema: no 5xx, no leaked page."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from specrag_jax.pipeline.specrag import RAGConfig
from specrag_jax.serving.app import create_app
from specrag_jax.serving.service import ServeConfig, Service
from specrag_jax.serving.tiny import tiny_text_model
from tests.serving.conftest import DOCS, assert_pages_home


@pytest.fixture(scope="module")
def fuzz_service():
    from specrag_jax.pipeline.factory import lexical_search
    from specrag_jax.retrieval import LexicalIndex

    # A short context bounds every generation; a trivial subset sampler keeps each RAG request cheap.
    drafter = tiny_text_model("tiny:llama", seed=5, num_pages=192, page_size=16, max_seq_len=256)
    verifier = tiny_text_model("tiny:gemma3", seed=6, num_pages=192, page_size=16, max_seq_len=256)
    subsets = lambda q, docs, k, m, seed: ([[i % len(docs)] for i in range(m)], {})  # noqa: E731
    config = ServeConfig(
        request_timeout=60,
        rag=RAGConfig(n_docs=2, m=2, k=1, max_draft_tokens=4, max_answer_tokens=4, max_doc_tokens=16),
    )
    svc = Service(
        drafter, verifier, subsets=subsets, search=lexical_search(LexicalIndex.build(DOCS)), config=config
    ).start()
    yield svc
    svc.stop(drain=False)


def test_no_server_error_and_no_leaked_page(fuzz_service):
    from hypothesis import given

    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(fuzz_service))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/rag", "/v1/completions", "/v1/chat/completions", "/health"}
    calls = []
    for op in operations:

        @given(case=op.as_strategy())
        @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case):
            response = case.call()
            calls.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
            for eng in fuzz_service.unique_engines.values():
                assert_pages_home(eng)

        run()
    assert len(calls) >= 2 * len(operations)
