"""Progressive prefill in ask and eval (``pipeline.concurrent_answers``): on shared started engines with a prefix
cache, the reranker on the drafter served by its engine, the same answers as one at a time without it."""

from __future__ import annotations

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.clustering import lexical_subsets
from specrag_jax.pipeline.concurrent_answers import SharedEngines, answer_rows, check_concurrency
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.rerank.engine_reranker import EngineReranker
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.reranker import Reranker
from specrag_jax.serving.tiny import tiny_text_model

CITIES = ["rome", "milan", "turin", "naples", "genoa", "venice", "bologna"]
ROWS = [
    {
        "question": f"Which city is number {q} in the list?",
        "docs": [
            {"id": c, "title": c.title(), "text": f"{c.title()} is city number {n} of the list."}
            for n, c in enumerate(CITIES)
        ],
    }
    for q in (2, 5)
]
METHODS = ["standard", "speculative"]


@pytest.fixture(scope="module")
def models():
    drafter = tiny_text_model("tiny:llama", seed=3, num_pages=200, page_size=16, max_seq_len=1024)
    verifier = tiny_text_model("tiny:llama", seed=4, num_pages=200, page_size=16, max_seq_len=1024)
    return drafter, verifier


def make_rag(models, progressive: int, rerank: str = "kv") -> SpecRAG:
    drafter, verifier = models
    config = RAGConfig(
        n_docs=2,
        m=2,
        k=1,
        max_draft_tokens=6,
        max_answer_tokens=4,
        max_doc_tokens=40,
        rerank=rerank,
        rerank_group=1,
        rerank_patience=3,
        progressive_prefill=progressive,
    )
    reranker = Reranker(drafter, mode=rerank, max_doc_tokens=40, cache_docs=0)
    return SpecRAG(drafter, verifier, subsets=lexical_subsets(), config=config, reranker=reranker)


def _answer(rag: SpecRAG, row: dict) -> dict:
    return rag.answer_methods(row["question"], row["docs"], METHODS)


def _pages_home(models) -> None:
    for model in models:
        alloc = model.runner.allocator
        assert alloc.num_free == alloc.num_usable


def test_progressive_prefill_answers_on_started_engines_as_one_at_a_time(models):
    plain = list(answer_rows(make_rag(models, 0), ROWS, _answer))
    _pages_home(models)
    rag = make_rag(models, 1)
    progressive = list(answer_rows(rag, ROWS, _answer))
    _pages_home(models)  # the engines stopped and their prefix caches gave every page back
    for before, after in zip(plain, progressive):
        for method in METHODS:
            b, a = before[method], after[method]
            assert a.trace["documents"] == b.trace["documents"]  # the engine-served reranker's order
            assert (a.answer, [d.text for d in a.drafts]) == (b.answer, [d.text for d in b.drafts])
            assert "progressive" not in b.trace
            info = a.trace["progressive"]
            assert info["trigger_stable_groups"] == 1 and not info["notes"], info
    launched = [ans["speculative"].trace["progressive"]["launches"] for ans in progressive]
    assert sum(launched) >= 1, launched  # a top set became stable before reranking ended
    cached = [ans["speculative"].trace["progressive"]["prefill_cached_tokens"] for ans in progressive]
    assert sum(cached) > 0, cached


def test_the_drafters_reranker_is_served_by_its_engine(models, tmp_path):
    shared = SharedEngines(make_rag(models, 1))
    assert shared.reranker_role == "drafter" and shared.prefix_cache
    with shared:
        pipeline = shared.pipeline()
        assert isinstance(pipeline.reranker, EngineReranker)
        assert pipeline.reranker.engine is shared.engines["drafter"] is pipeline.drafter.generator.engine
    stored = make_rag(models, 1)
    stored.reranker.store = store = DocKVStore(tmp_path, models[0])
    with SharedEngines(stored) as shared:
        assert shared.pipeline().reranker.store is store  # --kv-store: the engine reads the documents stored there
    unranked = make_rag(models, 0)
    unranked.reranker = None
    assert not SharedEngines(unranked).prefix_cache  # --concurrency alone keeps questions apart


def test_recompute_on_a_model_with_a_started_engine_is_refused(models):
    rag = make_rag(models, 1, rerank="recompute")
    with pytest.raises(SpecRagError, match="--rerank recompute on the drafter would run its model beside"):
        check_concurrency(rag, 1)
    check_concurrency(make_rag(models, 0, rerank="recompute"), 1)  # one at a time on the rag's own engines
