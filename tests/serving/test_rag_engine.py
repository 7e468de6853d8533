"""The pipeline on the engines: concurrent RAG requests interleave and give the one-at-a-time answers."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest

from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.requests import RequestCancelled
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from tests.serving.conftest import DOCS, assert_pages_home

QUESTIONS = ["What is the capital of France?", "Which city is known for cuisine?", "Capital of Germany?"]


def _key(ans) -> tuple:
    return ans.answer, ans.rationale, tuple(ans.citations), tuple((d.text, round(d.score, 3)) for d in ans.drafts)


def test_concurrent_rag_equals_one_at_a_time_and_direct_pipeline(make_service, rag_models, rag_resources):
    rag_cfg = RAGConfig(
        n_docs=4, m=3, k=2, max_draft_tokens=10, max_answer_tokens=5, max_doc_tokens=40, consensus=False
    )
    direct = SpecRAG(*rag_models, subsets=rag_resources[0], config=dataclasses.replace(rag_cfg))
    want = [_key(direct.answer(q, DOCS, "speculative")) for q in QUESTIONS[:1]]  # no engine: the plain pipeline
    svc = make_service(rag=rag_cfg).start()
    alone = [_key(svc.rag(q, DOCS, "speculative", RequestContext())) for q in QUESTIONS]
    assert alone[:1] == want
    before = {n: e.stats() for n, e in svc.unique_engines.items()}
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda q: _key(svc.rag(q, DOCS, "speculative", RequestContext())), QUESTIONS))
    assert together == alone
    after = {n: e.stats() for n, e in svc.unique_engines.items()}
    assert before["drafter"]["peak_running_requests"] == 1
    assert after["drafter"]["peak_running_requests"] >= 2  # requests' drafts shared the drafter's steps
    assert after["verifier"]["prefix_hit_tokens"] > 0  # repeated questions reuse verifier prefix pages
    for eng in svc.unique_engines.values():
        assert_pages_home(eng)


def test_cancelled_context_stops_the_pipeline(make_service):
    svc = make_service().start()
    ctx = RequestContext()
    ctx.cancel()
    with pytest.raises(RequestCancelled):
        svc.rag(QUESTIONS[0], DOCS, "speculative", ctx)
    for eng in svc.unique_engines.values():
        assert_pages_home(eng)


def test_lossless_through_the_engines_equals_standard_and_direct(make_service, rag_models, rag_resources):
    """method "lossless" (what /v1/rag's "method": "lossless" runs): the standard answer, decoded with
    token trees in the verifier's engine, equal to the direct pipeline's lossless and standard answers."""
    rag_cfg = RAGConfig(n_docs=4, m=3, k=2, max_draft_tokens=10, max_answer_tokens=12, max_doc_tokens=40)
    direct = SpecRAG(*rag_models, subsets=rag_resources[0], config=dataclasses.replace(rag_cfg))
    svc = make_service(rag=rag_cfg).start()
    answered = 0  # the random tiny verifier ends some answers at once (EOS first): no tree step to run there
    for q in QUESTIONS:
        want = direct.answer_methods(q, DOCS, ["standard", "lossless"])
        got = svc.rag(q, DOCS, "lossless", RequestContext())
        assert got.answer == want["lossless"].answer == want["standard"].answer
        if got.answer:
            answered += 1
            assert got.trace["speculation"]["steps"] >= 1
    assert answered >= 1
    assert svc.unique_engines["verifier"].stats()["spec_steps"] >= answered  # trees ran in the engine
    for eng in svc.unique_engines.values():
        assert_pages_home(eng)
