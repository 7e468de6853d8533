"""The pipeline's rerank stage: RAGConfig fields, SpecRAG with a fake reranker, eval --corpus recall (tiny models)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.run import STAGE_KEYS, evaluate, load_questions, stage_seconds
from specrag_jax.pipeline.clustering import clustered_subsets
from specrag_jax.pipeline.factory import lexical_search
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.retrieval import Embedder, LexicalIndex
from specrag_jax.retrieval.pooling import own_passage_recall, own_passages, passage_key, pool_file, pool_passages

DATA = Path(__file__).parent / "data" / "mini_eval.jsonl"


class WordOverlap:
    """A fake reranker: the number of question words in the document; records what it scored."""

    def __init__(self) -> None:
        self.scored: list[str] = []

    def score(self, question, docs):
        words = set(re.findall(r"\w+", question.lower()))
        self.scored += [d["id"] for d in docs]
        return [
            float(len(words & set(re.findall(r"\w+", (d.get("title", "") + " " + d["text"]).lower())))) for d in docs
        ]


@pytest.fixture(scope="module")
def tiny_models():
    from specrag_jax.serving.tiny import tiny_text_model

    return (
        tiny_text_model("tiny:llama", seed=1, num_pages=96, page_size=16, max_seq_len=1024),
        tiny_text_model("tiny:llama", seed=2, num_pages=96, page_size=16, max_seq_len=1024),
    )


def small_config(**kw) -> RAGConfig:
    return RAGConfig(
        **{"n_docs": 2, "m": 2, "k": 1, "max_draft_tokens": 4, "max_answer_tokens": 3, "max_doc_tokens": 40, **kw}
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rerank="bm25"), "unknown rerank mode 'bm25'; choose one of none, kv, recompute"),
        (dict(reranker=""), "reranker must be a model name"),
        (dict(n_coarse=0), "n_coarse (candidates to rerank) must be >= 1"),
        (dict(rerank_group=0), "rerank group size must be >= 1"),
        (dict(rerank_patience=0), "rerank patience must be >= 1"),
    ],
)
def test_rerank_config_out_of_range(kwargs, message):
    with pytest.raises(SpecRagError, match=re.escape(message)):
        RAGConfig(**kwargs).check()
    RAGConfig(rerank="kv", rerank_patience=math.inf).check()


def test_reranking_needs_a_reranker():
    with pytest.raises(SpecRagError, match="rerank 'kv' needs a reranker"):
        SpecRAG(None, None, subsets=lambda *a: ([], {}), config=RAGConfig(rerank="kv"))


def test_given_and_searched_documents_are_reranked(tiny_models):
    docs = [
        {"id": f"d{i}", "title": "", "text": t}
        for i, t in enumerate(
            [
                "Oslo is in Norway.",
                "Lyon is a city.",
                "Paris is the capital of France.",
                "Rome is old.",
                "France has a capital.",
                "Berlin is big.",
            ]
        )
    ]
    scorer = WordOverlap()
    rag = SpecRAG(
        tiny_models[0],
        tiny_models[1],
        subsets=lambda *a: ([], {}),
        search=lexical_search(LexicalIndex.build(docs)),
        config=small_config(rerank="recompute", n_coarse=3, rerank_group=2, rerank_patience=math.inf),
        reranker=scorer,
    )
    trace: dict = {}
    got = rag._documents("What is the capital of France?", docs, [], trace)
    assert [d["id"] for d in got] == ["d2", "d4"] and trace["documents"] == ["d2", "d4"]
    assert scorer.scored == [d["id"] for d in docs]  # every given passage, in the order given
    assert trace["rerank"]["candidates"] == 6 and trace["rerank"]["groups_scored"] == 3 and trace["rerank_s"] >= 0
    scorer.scored.clear()
    trace = {}
    got = rag._documents("capital of France", None, [], trace)  # the search's top n_coarse, reranked
    assert trace["rerank"]["candidates"] == 2 == len(scorer.scored)  # only 2 documents share a term
    assert {d["id"] for d in got} == {"d2", "d4"}


def test_every_method_pays_for_the_rerank_stage(tiny_models):
    rag = SpecRAG(
        tiny_models[0],
        tiny_models[1],
        subsets=lambda q, d, k, m, s: ([[0], [1]], {}),
        config=small_config(rerank="kv", rerank_group=1, rerank_patience=1),
        reranker=WordOverlap(),
    )
    docs = ["Paris is the capital of France.", "Lyon is a city.", "Oslo is in Norway.", "Rome is old."]
    out = rag.answer_methods("What is the capital of France?", docs, ["standard", "drafter_only"])
    for ans in out.values():
        st = stage_seconds(ans.trace)
        assert "rerank_s" in STAGE_KEYS and st["rerank_s"] == ans.trace["rerank"]["rerank_s"] > 0
        assert ans.trace["total_s"] >= st["rerank_s"] + st["retrieval_s"]
        assert ans.trace["rerank"]["early"] and ans.trace["rerank"]["groups_scored"] == 3  # of 4


def test_pool_and_recall_own_passages(tmp_path):
    rows = load_questions(DATA)
    pooled = pool_passages(rows + rows)  # a passage seen twice is pooled once
    assert len(pooled) == 5 and [d["id"] for d in pooled] == [f"p{i}" for i in range(5)]
    assert pool_file(DATA, tmp_path / "c.jsonl") == 5
    own = own_passages(rows[0])
    assert own_passage_recall(own, [passage_key(own[0]), "other"]) == pytest.approx(1 / 3)
    assert own_passage_recall([], ["x"]) is None and own_passages({"question": "q"}) == []


def test_evaluate_from_a_corpus_reports_recall_and_early_termination(tiny_models):
    rows = load_questions(DATA)
    corpus = pool_passages(rows)
    scorer = WordOverlap()
    rag = SpecRAG(
        tiny_models[0],
        tiny_models[1],
        subsets=clustered_subsets(Embedder(tiny_models[0])),
        search=lexical_search(LexicalIndex.build(corpus)),
        config=small_config(rerank="kv", n_coarse=5, rerank_group=1, rerank_patience=1),
        reranker=scorer,
    )
    res = evaluate(rag, rows, ["closed_book", "standard"], progress=False, corpus=corpus)
    std = res["methods"]["standard"]
    assert "recall_own_passages" not in res["methods"]["closed_book"]
    assert 0.0 < std["recall_own_passages"] <= 1.0
    rr = std["rerank"]
    assert rr["questions"] == 2 and 0.0 <= rr["saved_fraction"] < 1.0 and rr["groups_scored"] >= 2
    assert "rerank_s" in std["stages_s"]
    pred = [p for p in res["predictions"] if p["method"] == "standard"]
    assert all(len(p["documents"]) == 2 and p["rerank"]["mode"] == "kv" for p in pred)
    # Paris question: the pooled top 2 by overlap hold its own "Paris" passage (1 of its 3)
    assert pred[0]["recall_own_passages"] == pytest.approx(
        own_passage_recall(own_passages(rows[0]), [passage_key(d) for d in corpus if d["id"] in pred[0]["documents"]])
    )


@pytest.mark.parametrize(
    "reranker, role", [(None, "drafter"), ("v", "verifier"), ("verifier", "verifier"), ("other-model", None)]
)
def test_build_specrag_builds_the_reranker(monkeypatch, tiny_models, reranker, role):
    from specrag_jax.pipeline import factory

    loads, made = [], []

    class Loader:
        @staticmethod
        def load(name, **kw):
            loads.append((name, kw.get("num_pages")))
            return tiny_models[0]

    monkeypatch.setattr(factory, "TextModel", Loader)
    monkeypatch.setattr(factory, "DocKVStore", lambda directory, model: ("store", directory))
    monkeypatch.setattr(factory, "Reranker", lambda model, **kw: made.append(kw) or WordOverlap())
    cfg = RAGConfig(rerank="kv", reranker=reranker, m=2)
    docs = [{"id": "a", "title": "", "text": "some text"}]
    rag = factory.build_specrag("d", "v", corpus=docs, config=cfg, kv_dir="kv")
    assert isinstance(rag.reranker, WordOverlap)
    assert made == [{"store": ("store", "kv"), "mode": "kv", "max_doc_tokens": 160, "cache_docs": 64}]
    extra = factory.reranker_pages(cfg)
    assert extra == 74 * 18  # (64 cached + a group of 10) documents of up to 160 + 128 tokens, 16 per page
    want = [
        ("d", factory.pool_pages(2, 2048, extra) if role == "drafter" else None),
        ("v", factory.pool_pages(2, 2048, extra) if role == "verifier" else None),
    ]
    # the drafter and the verifier load on two threads, in either order; another reranker model after both
    assert sorted(loads[:2]) == want and loads[2:] == (
        [] if role else [("other-model", factory.pool_pages(1, 2048, extra))]
    )
    none = factory.build_specrag("d", "v", corpus=docs, config=RAGConfig())
    assert none.reranker is None and sorted(loads[-2:]) == [("d", None), ("v", None)]


def test_unknown_clustering_is_refused():
    with pytest.raises(SpecRagError, match="unknown clustering 'bert'; choose one of drafter, lexical"):
        RAGConfig(clustering="bert").check()
