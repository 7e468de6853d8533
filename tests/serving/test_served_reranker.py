"""The engine-served reranker inside the server: /v1/rag's kv reranking on the drafter's engine (documents from its
prefix cache), and warm-up compiling that engine's scoring shapes."""

from __future__ import annotations

from tests.serving.conftest import DOCS, assert_pages_home

QUESTION = "What is the capital of Italy?"


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


def test_served_reranker_reads_the_document_store(rag_models, rag_resources, tmp_path):
    """With ``reranker_store`` (``serve --kv-store``), a new server's first request finds the stored documents'
    full pages in the drafter engine's cache instead of prefilling them."""
    from fastapi.testclient import TestClient

    from specrag_jax.pipeline.specrag import RAGConfig
    from specrag_jax.rerank.kv_store import DocKVStore
    from specrag_jax.rerank.reranker import Reranker
    from specrag_jax.serving.app import create_app
    from specrag_jax.serving.service import ServeConfig, Service

    drafter = rag_models[0]
    store = DocKVStore(tmp_path, drafter)
    Reranker(drafter, store=store, mode="kv", max_doc_tokens=40, cache_docs=0).ensure_stored(DOCS)
    rag = RAGConfig(n_docs=2, m=2, k=1, max_draft_tokens=6, max_answer_tokens=4, max_doc_tokens=40, rerank="kv")
    svc = Service(
        *rag_models,
        subsets=rag_resources[0],
        search=rag_resources[1],
        config=ServeConfig(rag=rag),
        reranker=lambda mode: None,
        reranker_store=store,
    )
    body = {"question": QUESTION, "documents": DOCS, "method": "standard", "rerank_group": 2}
    with TestClient(create_app(svc)) as c:
        assert c.post("/v1/rag", json=body).status_code == 200
        assert svc.engines["drafter"].stats()["prefix_hit_tokens"] >= 4 * 16  # the first request, from the store
        assert svc.reranker("kv").loaded == 4
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
