"""Serving fixtures: tiny random models (character tokenizer) and an engine factory that checks pages."""

from __future__ import annotations

import time

import pytest

from specrag_jax.serving.engine import Engine
from specrag_jax.serving.tiny import tiny_text_model


def assert_pages_home(engine: Engine, wait: float = 10.0) -> None:
    """No request running (waits up to ``wait`` s for cancelled work to be reaped): every usable page is free
    or held by the prefix cache alone."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and (engine.stats()["running_requests"] or engine.stats()["queue_depth"]):
        time.sleep(0.02)
    st = engine.stats()
    assert st["running_requests"] == 0 and st["queue_depth"] == 0, st
    assert st["pages_free"] + st["pages_cached"] == st["pages_total"], st


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_text_model("tiny:llama", seed=3, num_pages=96, page_size=4, max_seq_len=256)


@pytest.fixture(scope="session")
def tiny_gemma():
    return tiny_text_model("tiny:gemma3", seed=4, num_pages=96, page_size=4, max_seq_len=256)


@pytest.fixture
def engine(tiny_model):
    eng = Engine(tiny_model.runner, tiny_model.generator.eos_ids, name="test").start()
    yield eng
    eng.stop(drain=False)
    eng.cache.clear()
    assert tiny_model.runner.allocator.num_free == tiny_model.runner.allocator.num_usable


DOCS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "lyon", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine."},
    {"id": "berlin", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"id": "rome", "title": "Rome", "text": "Rome is the capital of Italy."},
]


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
