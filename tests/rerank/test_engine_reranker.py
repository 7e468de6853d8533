"""The engine-served reranker: same scores as the direct one, documents reused from the radix prefix cache and
read from the document K/V store (a new engine, a new process's, prefills no stored full page), batched
submission, cancellation without leaked pages, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.requests import RequestCancelled
from specrag_jax.rerank.engine_reranker import EngineReranker
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.reranker import Reranker
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


@pytest.fixture(scope="module")
def stored(model, tmp_path_factory):
    """A store the direct kv reranker filled (as ``specrag index`` or an earlier ask would), and its scores."""
    directory = tmp_path_factory.mktemp("doc_kv")
    direct = Reranker(model, store=DocKVStore(directory, model), mode="kv", max_doc_tokens=40, cache_docs=0)
    assert direct.ensure_stored(DOCS)["computed"] == len(DOCS)
    return directory, direct.score(QUESTION, DOCS)


def test_stored_documents_are_read_not_prefilled(model, stored, engine):  # the store filled before the engine runs
    directory, want = stored
    rr = EngineReranker(model, engine, max_doc_tokens=40, store=DocKVStore(directory, model))
    scores = rr.score(QUESTION, DOCS)
    np.testing.assert_allclose(scores, want, atol=1e-4)
    full_pages = sum(len(rr.prompt.doc_ids(d)) // 8 * 8 for d in DOCS)
    assert full_pages > 0 and engine.stats()["prefix_hit_tokens"] >= full_pages  # on the first call, from the store
    assert rr.loaded == len(DOCS)
    rr.score("Which city is the capital of Germany?", DOCS)
    assert rr.loaded == len(DOCS)  # cached now: the store is not read again
    assert_pages_home(engine)


def test_an_empty_store_changes_nothing(model, stored, engine, tmp_path):
    _, want = stored
    rr = EngineReranker(model, engine, max_doc_tokens=40, store=DocKVStore(tmp_path, model))
    np.testing.assert_allclose(rr.score(QUESTION, DOCS), want, atol=1e-4)
    assert rr.loaded == 0 and engine.stats()["prefix_hit_tokens"] == 0
    assert not any(tmp_path.iterdir())  # the engine-served reranker reads the store, never writes it
    assert_pages_home(engine)
