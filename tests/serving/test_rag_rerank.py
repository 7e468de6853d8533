"""/v1/rag's rerank fields (rerank, reranker, n_coarse, rerank_group, rerank_patience) with a fake reranker."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from specrag_jax.serving.app import create_app
from tests.serving.conftest import DOCS, assert_pages_home
from tests.serving.rag_schema_check import assert_follows_rag_schema


class WordOverlap:
    """Fake reranker: question words found in the document."""

    def __init__(self, mode: str) -> None:
        self.mode, self.calls = mode, 0

    def score(self, question, docs):
        self.calls += 1
        words = set(re.findall(r"\w+", question.lower()))
        return [float(len(words & set(re.findall(r"\w+", d["text"].lower())))) for d in docs]


@pytest.fixture
def rerank_client(rag_models, rag_resources):
    from specrag_jax.pipeline.specrag import RAGConfig
    from specrag_jax.serving.service import ServeConfig, Service

    built: dict[str, WordOverlap] = {}

    def factory(mode):
        built[mode] = WordOverlap(mode)
        return built[mode]

    rag = RAGConfig(n_docs=2, m=2, k=1, max_draft_tokens=8, max_answer_tokens=4, max_doc_tokens=40, rerank="kv")
    svc = Service(
        *rag_models,
        subsets=rag_resources[0],
        search=rag_resources[1],
        config=ServeConfig(rag=rag),
        reranker=factory,
        engine_reranker=False,
    )  # the fake scores kv mode too
    with TestClient(create_app(svc)) as c:
        c.service, c.built = svc, built
        yield c
    for eng in svc.unique_engines.values():
        eng.cache.clear()


def test_rag_reranks_given_and_searched_documents(rerank_client):
    c = rerank_client
    r = c.post(
        "/v1/rag",
        json={
            "question": "What is the capital of Italy?",
            "documents": DOCS,
            "method": "standard",
            "rerank_group": 1,
            "rerank_patience": 1,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["citations"][0] == "rome" and len(body["citations"]) == 2  # reranked to the top n_docs
    tr = body["trace"]["rerank"]
    assert tr["mode"] == "kv" and tr["candidates"] == 4 and tr["groups_scored"] <= 4 and "rerank_s" in body["trace"]
    assert_follows_rag_schema(c.get("/openapi.json").json(), body)
    r = c.post(
        "/v1/rag",
        json={
            "question": "capital of Germany",
            "method": "standard",
            "rerank": "recompute",
            "n_coarse": 3,
            "reranker": "drafter",
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["trace"]["rerank"]["candidates"] <= 3 and r.json()["trace"]["rerank"]["mode"] == "recompute"
    assert set(c.built) == {"kv", "recompute"}
    r = c.post(
        "/v1/rag", json={"question": "capital of Italy", "method": "standard", "rerank": "none", "documents": DOCS}
    )
    assert r.status_code == 200 and "rerank" not in r.json()["trace"]
    for eng in c.service.unique_engines.values():
        assert_pages_home(eng)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"rerank": "bm25"}, "rerank"),
        ({"rerank_group": 0}, "rerank_group"),
        ({"n_coarse": 0}, "n_coarse"),
        ({"rerank_patience": 0}, "rerank_patience"),
        ({"reranker": "qwen3-8b"}, "this server reranks with"),
    ],
)
def test_rag_bad_rerank_fields(rerank_client, extra, message):
    r = rerank_client.post("/v1/rag", json={"question": "q", "documents": DOCS, **extra})
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_server_without_a_reranker_refuses_reranking(make_service):
    with TestClient(create_app(make_service())) as c:
        r = c.post("/v1/rag", json={"question": "q", "documents": DOCS, "rerank": "kv"})
    assert r.status_code == 400 and "no reranker" in r.json()["error"]["message"], r.text


def test_serve_builds_rerankers_on_their_own_model(monkeypatch, tmp_path):
    """kv mode on the drafter runs on the drafter's engine; recompute mode on its own copy of the model,
    loaded when first asked for; both score the same."""
    import argparse

    from specrag_jax.rerank import kv_store
    from specrag_jax.rerank.engine_reranker import EngineReranker
    from specrag_jax.serving.cli import add_serve_parser, build_service

    monkeypatch.setattr(kv_store, "default_store_dir", lambda: tmp_path / "doc_kv")
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "serve",
            "--drafter",
            "tiny:llama",
            "--verifier",
            "tiny:gemma3",
            "--rerank",
            "kv",
            "--num-pages",
            "64",
            "--rerank-group",
            "2",
        ]
    )
    svc = build_service(args).start()
    try:
        kv, recompute = svc.reranker("kv"), svc.reranker("recompute")
        assert svc.reranker("kv") is kv and svc.config.rag.rerank_group == 2
        assert isinstance(kv, EngineReranker) and kv.engine is svc.engines["drafter"]
        assert kv.store.directory.parent == tmp_path / "doc_kv"  # the engine reads the default --kv-store
        assert kv.store.model_key["weights"] == kv_store.weights_fingerprint(svc.models["drafter"].runner)
        assert recompute.scorer.runner is not svc.models["drafter"].runner and recompute.scorer.mode == "recompute"
        assert kv.score("capital of France?", DOCS[:2]) == pytest.approx(
            recompute.score("capital of France?", DOCS[:2]), abs=1e-4
        )
    finally:
        svc.stop(drain=False)
