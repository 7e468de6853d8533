"""Reranker: stored-K/V scores equal recompute scores, the LRU loads nothing twice, pages never leak."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.reranker import Reranker
from specrag_jax.serving.tiny import tiny_text_model

QUESTION = "Which river flows through the old town?"
DOCS = [
    {"id": str(i), "title": f"Doc {i}", "text": f"The river number {i} runs past the mill. " * (1 + 2 * i)}
    for i in range(6)
]


def _model(arch: str, **kw):
    return tiny_text_model(f"tiny:{arch}", num_pages=kw.pop("num_pages", 160), page_size=16, **kw)


def _no_leaks(model) -> None:
    alloc = model.runner.allocator
    assert alloc.num_free == alloc.num_usable


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    return _model(request.param)


def test_stored_kv_scores_equal_recompute(model, tmp_path):
    baseline = Reranker(model, mode="recompute").score(QUESTION, DOCS)
    store = DocKVStore(tmp_path, model)
    with Reranker(model, store=store) as first:  # computes and stores
        computed = first.score(QUESTION, DOCS)
        assert first.stats.computed == len(DOCS) and first.stats.stored == len(DOCS)
    with Reranker(model, store=store) as second:  # loads every prefix from disk
        loaded = second.score(QUESTION, DOCS)
        assert second.stats.loaded == len(DOCS) and second.stats.computed == 0
        assert second.stats.steps == 1  # all candidates in one packed step
    np.testing.assert_allclose(computed, baseline, atol=1e-4)
    np.testing.assert_allclose(loaded, baseline, atol=1e-4)
    assert loaded == computed  # float32 K/V round-trips exactly
    assert len(set(np.round(baseline, 6))) > 1  # the scores do tell documents apart
    _no_leaks(model)


def test_second_query_loads_nothing(model, tmp_path):
    with Reranker(model, store=DocKVStore(tmp_path, model)) as r:
        r.score(QUESTION, DOCS)
        stats = (r.stats.loaded, r.stats.computed)
        again = r.score("Where is the mill?", DOCS[::-1] + DOCS[:1])  # reordered, with a duplicate
        assert (r.stats.loaded, r.stats.computed) == stats
        assert r.stats.cache_hits == len(DOCS)
        solo = Reranker(model, mode="recompute").score("Where is the mill?", DOCS[::-1] + DOCS[:1])
        np.testing.assert_allclose(again, solo, atol=1e-4)
        assert again[-1] == pytest.approx(again[len(DOCS) - 1], abs=1e-5)  # the duplicate
    _no_leaks(model)


def test_small_pool_evicts_and_splits():
    model = _model("llama", num_pages=40)  # 39 pages of 16 tokens; the six documents need 100
    with Reranker(model, cache_docs=64) as r:
        got = r.score(QUESTION, DOCS)
        assert r.stats.steps > 1 and r.stats.evicted > 0
        got2 = r.score(QUESTION, DOCS)
    want = Reranker(model, mode="recompute").score(QUESTION, DOCS)
    np.testing.assert_allclose(got, want, atol=1e-4)
    np.testing.assert_allclose(got2, want, atol=1e-4)
    _no_leaks(model)


def test_small_pool_index_splits_or_fails_cleanly(tmp_path):
    model = _model("llama", num_pages=40)
    r = Reranker(model, store=DocKVStore(tmp_path, model), token_budget=4096)
    assert r.ensure_stored(DOCS)["computed"] == len(DOCS)
    assert r.ensure_stored(DOCS)["skipped"] == len(DOCS)
    _no_leaks(model)
    tiny_pool = _model("llama", num_pages=4)
    with pytest.raises(SpecRagError, match="cannot hold one document"):
        Reranker(tiny_pool).score(QUESTION, DOCS[:2])
    with pytest.raises(SpecRagError, match="cannot hold one document"):
        Reranker(tiny_pool, store=DocKVStore(tmp_path / "empty", tiny_pool)).ensure_stored(DOCS[:2])
    _no_leaks(tiny_pool)


def test_errors_release_pages(model, monkeypatch):
    r = Reranker(model, cache_docs=0)

    def boom(*_a, **_k):
        raise RuntimeError("injected")

    monkeypatch.setattr(model.runner, "score", boom)
    with pytest.raises(RuntimeError, match="injected"):
        r.score(QUESTION, DOCS)
    monkeypatch.undo()
    _no_leaks(model)


def test_bad_input_is_one_line_error(model):
    r = Reranker(model)
    assert r.score(QUESTION, []) == []
    for question, docs, match in [
        ("", DOCS, "non-empty question"),
        (QUESTION, ["a string"], "must be a dict"),
        (QUESTION, [{"text": 3}], "must be a dict"),
    ]:
        with pytest.raises(SpecRagError, match=match):
            r.score(question, docs)
    with pytest.raises(SpecRagError, match="rerank mode"):
        Reranker(model, mode="fast")
    with pytest.raises(SpecRagError, match="exceed"):
        Reranker(model, max_doc_tokens=5000).score(QUESTION, [{"text": "x" * 3000}])
    _no_leaks(model)
