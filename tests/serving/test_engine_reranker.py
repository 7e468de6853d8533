"""The engine-served reranker: same scores as the direct one, documents reused from the radix prefix cache,
batched submission, cancellation without leaked pages, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.requests import RequestCancelled
from specrag_jax.rerank.reranker import Reranker
from specrag_jax.serving.engine_reranker import EngineReranker
from specrag_jax.serving.tiny import tiny_text_model
from tests.serving.conftest import DOCS, assert_pages_home

QUESTION = "What is the capital of Italy?"


@pytest.fixture(scope="module")
def model():
    return tiny_text_model("tiny:llama", seed=5, num_pages=160, page_size=8, max_seq_len=512)


@pytest.fixture(scope="module")
def direct_scores(model):
    """Scores of the direct reranker (recompute and kv modes) on the same model, before any engine runs it."""
    return {
        mode: Reranker(model, mode=mode, max_doc_tokens=40, cache_docs=0).score(QUESTION, DOCS)
        for mode in ("recompute", "kv")
    }


@pytest.fixture
def engine(model, direct_scores):
    eng = Engine(model.runner, model.generator.eos_ids, name="reranker").start()
    yield eng
    eng.stop(drain=False)
    eng.cache.clear()
    assert model.runner.allocator.num_free == model.runner.allocator.num_usable


def test_scores_equal_the_direct_reranker(model, engine, direct_scores):
    scores = EngineReranker(model, engine, max_doc_tokens=40).score(QUESTION, DOCS)
    np.testing.assert_allclose(scores, direct_scores["recompute"], atol=1e-4)
    np.testing.assert_allclose(scores, direct_scores["kv"], atol=1e-4)
    assert_pages_home(engine)


def test_a_document_scored_again_comes_from_the_prefix_cache(model, engine):
    rr = EngineReranker(model, engine, max_doc_tokens=40)
    first = rr.score(QUESTION, DOCS)
    hit0 = engine.stats()["prefix_hit_tokens"]
    again = rr.score("Which city is the capital of Germany?", DOCS)  # same documents, another question
    saved = engine.stats()["prefix_hit_tokens"] - hit0
    full_pages = sum(len(rr.prompt.doc_ids(d)) // 8 * 8 for d in DOCS)
    assert saved >= full_pages > 0  # every document's full pages were reused, none recomputed
    assert rr.score(QUESTION, DOCS) == pytest.approx(first, abs=1e-5)  # the cached K/V scores the same
    assert again != first
    assert_pages_home(engine)


def test_cancelled_request_leaks_no_pages(model, engine):
    ctx = RequestContext()
    ctx.cancel()
    with pytest.raises(RequestCancelled):
        EngineReranker(model, engine, max_doc_tokens=40).bind(ctx).score(QUESTION, DOCS)
    assert_pages_home(engine)


def test_bad_input_is_a_one_line_error(model, engine):
    rr = EngineReranker(model, engine, max_doc_tokens=400)
    with pytest.raises(SpecRagError, match="non-empty question"):
        rr.score("  ", DOCS)
    with pytest.raises(SpecRagError, match="exceeds the reranker's 512 positions"):
        rr.score(QUESTION, [{"text": "word " * 600}])
    other = tiny_text_model("tiny:llama", seed=6, num_pages=8, page_size=8, max_seq_len=64)
    with pytest.raises(SpecRagError, match="does not serve model"):
        EngineReranker(other, engine)
    assert rr.score(QUESTION, []) == []
    assert_pages_home(engine)


def test_served_rag_reranks_on_the_drafter_engine(rag_models, rag_resources):
    """/v1/rag's kv reranking runs on the drafter's engine: the factory (a second model) is never called,
    and a second request over the same documents finds them in the drafter engine's prefix cache."""
    from fastapi.testclient import TestClient

    from specrag_jax.pipeline.specrag import RAGConfig
    from specrag_jax.serving.app import create_app
    from specrag_jax.serving.service import ServeConfig, Service

    called = []
    rag = RAGConfig(n_docs=2, m=2, k=1, max_draft_tokens=6, max_answer_tokens=4, max_doc_tokens=40, rerank="kv")
    svc = Service(
        *rag_models,
        subsets=rag_resources[0],
        search=rag_resources[1],
        config=ServeConfig(rag=rag),
        reranker=lambda mode: called.append(mode),
    )
    body = {"question": QUESTION, "documents": DOCS, "method": "standard", "rerank_group": 2}
    with TestClient(create_app(svc)) as c:
        r = c.post("/v1/rag", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["trace"]["rerank"]["candidates"] == 4
        drafter = svc.engines["drafter"]
        hit0 = drafter.stats()["prefix_hit_tokens"]
        assert c.post("/v1/rag", json={**body, "question": "capital of Germany?"}).status_code == 200
        assert drafter.stats()["prefix_hit_tokens"] - hit0 >= 4 * 16  # each document's first page at least
    assert called == []
    for eng in svc.unique_engines.values():
        assert_pages_home(eng)
        eng.cache.clear()


def test_warmup_compiles_scoring_shapes_on_the_reranking_engine(monkeypatch, rag_models, rag_resources):
    from specrag_jax.models.engine.warmup import WarmupReport
    from specrag_jax.pipeline.specrag import RAGConfig
    from specrag_jax.serving import service as service_mod
    from specrag_jax.serving.service import ServeConfig, Service

    seen: dict[str, set[str]] = {}
    monkeypatch.setattr(
        service_mod,
        "warmup",
        lambda eng, shapes: seen.setdefault(eng.name, {s.kind for s in shapes}) and WarmupReport(len(shapes), 0.0, 0.0),
    )
    monkeypatch.setattr(service_mod, "check_map_budget", lambda programs: None)  # nothing is compiled here
    for rerank, drafter_scores in (("kv", True), ("none", False)):
        seen.clear()
        svc = Service(
            *rag_models,
            subsets=rag_resources[0],
            search=rag_resources[1],
            config=ServeConfig(rag=RAGConfig(rerank=rerank)),
            reranker=None if rerank == "none" else (lambda mode: None),
        )
        svc.warmup("full")
        assert ("score" in seen["drafter"]) is drafter_scores and "score" in seen["verifier"]
