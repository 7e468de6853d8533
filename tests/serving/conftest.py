"""Serving fixtures: the RAG models and resources on tiny random models, a service factory that checks pages."""

from __future__ import annotations

import pytest

from specrag_jax.serving.tiny import tiny_text_model
from tests.models.engine.conftest import DOCS, assert_pages_home  # noqa: F401 (serving tests import them here)


@pytest.fixture(scope="session")
def rag_models():
    """(drafter, verifier): tiny llama and tiny gemma3 with room for RAG prompts."""
    return (
        tiny_text_model("tiny:llama", seed=1, num_pages=192, page_size=16, max_seq_len=1024),
        tiny_text_model("tiny:gemma3", seed=2, num_pages=192, page_size=16, max_seq_len=1024),
    )


@pytest.fixture(scope="session")
def rag_resources(rag_models):
    from specrag_jax.pipeline.clustering import clustered_subsets
    from specrag_jax.pipeline.factory import lexical_search
    from specrag_jax.retrieval import Embedder, LexicalIndex

    return clustered_subsets(Embedder(rag_models[0])), lexical_search(LexicalIndex.build(DOCS))


@pytest.fixture
def make_service(rag_models, rag_resources):
    """``make_service(**ServeConfig fields)``: a not-yet-started Service on the tiny models; stopped after."""
    from specrag_jax.pipeline.specrag import RAGConfig
    from specrag_jax.serving.service import ServeConfig, Service

    made = []

    def make(**kw):
        kw.setdefault("rag", RAGConfig(n_docs=4, m=3, k=2, max_draft_tokens=12, max_answer_tokens=6, max_doc_tokens=40))
        svc = Service(*rag_models, subsets=rag_resources[0], search=rag_resources[1], config=ServeConfig(**kw))
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.stop(drain=False)
        for eng in svc.unique_engines.values():
            eng.cache.clear()
    for m in rag_models:
        assert m.runner.allocator.num_free == m.runner.allocator.num_usable
