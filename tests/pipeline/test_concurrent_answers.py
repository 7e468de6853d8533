"""``evaluate(..., concurrency=N)``: questions at once on shared started engines, against one at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.run import evaluate, load_questions
from specrag_jax.pipeline.concurrent_answers import SharedEngines, check_concurrency
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.serving.tiny import tiny_text_model

ROWS = load_questions(Path(__file__).parent / "data" / "mini_eval.jsonl")


@pytest.fixture(scope="module")
def rag() -> SpecRAG:
    from specrag_jax.pipeline.clustering import lexical_subsets

    drafter = tiny_text_model("tiny:llama", seed=1, num_pages=160, page_size=16, max_seq_len=1024)
    verifier = tiny_text_model("tiny:llama", seed=2, num_pages=160, page_size=16, max_seq_len=1024)
    config = RAGConfig(n_docs=2, m=2, k=1, max_draft_tokens=6, max_answer_tokens=4, max_doc_tokens=40)
    return SpecRAG(drafter, verifier, subsets=lexical_subsets(), config=config)


def _answers(res: dict) -> list[tuple]:
    return [(p["method"], p["question_id"], p["answer"], [d["text"] for d in p["drafts"]]) for p in res["predictions"]]


def test_concurrent_questions_give_the_answers_of_one_at_a_time(rag):
    rows = [dict(r, question_id=f"{r.get('question_id')}-{i}") for i, r in enumerate(ROWS * 3)]
    methods = ["standard", "speculative", "drafter_only"]
    runner = rag.drafter.runner
    real_pack, widest = runner.pack, {1: 0, 3: 0}

    def pack(chunks, **kw):  # the most draft rows (m = 2 per question) in one decode step
        if all(len(c.tokens) == 1 for c in chunks):
            widest[level] = max(widest[level], len(chunks))
        return real_pack(chunks, **kw)

    runner.pack = pack
    try:
        level = 1
        one = evaluate(rag, rows, methods, progress=False)
        level = 3
        three = evaluate(rag, rows, methods, progress=False, concurrency=3)
    finally:
        runner.pack = real_pack
    assert widest[1] <= 2 < widest[3], widest  # one question's two drafts, or several questions' in one step
    assert _answers(three) == _answers(one)
    assert [p["question_id"] for p in three["predictions"]] == [p["question_id"] for p in one["predictions"]]
    for model in (rag.drafter, rag.verifier):
        alloc = model.runner.allocator
        assert alloc.num_free == alloc.num_usable  # every page home after the engines stopped
    assert rag.answer("What is 2+2?", ["Two and two make four."]).answer is not None  # its own engine still drives


def test_shared_engines_serve_both_roles_of_one_model_with_one_engine(rag):
    same = SpecRAG(rag.drafter, rag.drafter, subsets=rag.subsets_fn, config=rag.config)
    shared = SharedEngines(same)
    assert shared.engines["drafter"] is shared.engines["verifier"]
    with shared:
        assert shared.pipeline().drafter.generator.engine is shared.engines["drafter"]


def test_concurrency_errors_are_one_line(rag):
    with pytest.raises(SpecRagError, match="--concurrency must be >= 1"):
        check_concurrency(rag, 0)
    drafter_clustered = SpecRAG(
        rag.drafter, rag.verifier, subsets=rag.subsets_fn, config=RAGConfig(clustering="drafter")
    )
    with pytest.raises(SpecRagError, match="--clustering lexical"):
        evaluate(drafter_clustered, ROWS, ["standard"], progress=False, concurrency=2)
    check_concurrency(drafter_clustered, 1)  # one at a time runs on the rag's own engines: anything goes
