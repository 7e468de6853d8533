"""Reranking and progressive prefill: why both are off by default."""

from __future__ import annotations

from benchmarks.claim_sections.formats import F2, F3, S1, S2, X2
from benchmarks.report_specs import Claim, Figures, Rows, Section
from benchmarks.report_text import pct

_QUALITY_COLS = (("accuracy", "accuracy", pct), ("recall of own passages", "recall_own_passages", F2))
_EARLY_TERMINATION = Rows(
    "summary/early_termination",
    (("saved", "saved_fraction", pct), ("same top 10 as full", "same_set_as_full_fraction", pct)),
    key="patience",
)


def _early_stop_figures(*ceiling: tuple) -> Figures:
    """The figures of a rerank_early_stop.py file; ``ceiling`` the recall of BM25's whole candidate list."""
    recall = "summary/recall_own_passages"
    return Figures(
        (
            ("questions", "summary/questions", "{}"),
            ("recall, BM25 top 10", f"{recall}/bm25_top_n_docs", F2),
            ("recall, full rerank top 10", f"{recall}/full_rerank_top_n_docs", F2),
            *ceiling,
            ("fine scoring s per question", "summary/fine_s_per_question", S1),
        )
    )


RERANK = Section(
    "Reranking and progressive prefill",
    'docs/method.md "Reranking and progressive prefill": reranking is off by default because the drafter '
    "reranker lowered recall and accuracy; progressive prefill is off because on 2 cores it moves work instead of "
    "removing it.",
    (
        Claim(
            "rerank_quality.json",
            "Accuracy with and without the drafter reranker",
            "The first 30 dev questions, each retrieving from the whole pooled corpus (the CPU shared with other "
            "jobs, so every stage's seconds are inflated alike).",
            (
                *(
                    Rows(f"configs/{config}/methods", _QUALITY_COLS, key=key)
                    for config, key in (
                        ("bm25", "BM25 top 10"),
                        ("rerank_drafter", "BM25 top 50, drafter rerank to 10"),
                    )
                ),
            ),
        ),
        Claim(
            "rerank_early_stop.json",
            "Recall after the drafter reranker, and early termination",
            "BM25 top 50 of the pooled corpus, every candidate scored by SmolLM2-135M, the stopping rule replayed.",
            (
                _early_stop_figures(
                    ("recall ceiling (BM25 top 50)", "summary/recall_own_passages/bm25_top_n_coarse (ceiling)", F2)
                ),
                _EARLY_TERMINATION,
            ),
        ),
        Claim(
            "rerank_early_stop_verifier.json",
            "Recall with the verifier as reranker",
            "The same replay with Qwen2.5-Coder-1.5B-Instruct scoring (first 10 questions): recall about BM25's, at "
            "minutes per question on this CPU.",
            (
                _early_stop_figures(),
                _EARLY_TERMINATION,
            ),
        ),
        Claim(
            "rerank_kv.json",
            "Stored document K/V against recomputing",
            "`--rerank kv` (documents' K/V from `specrag index`) against `recompute`: the same scores, several times "
            "the pairs per second (SmolLM2-135M, 8 candidates x 3 questions).",
            (
                Rows(
                    "results",
                    (
                        ("recompute pairs/s", "recompute/pairs_per_s", "{:.2f}"),
                        ("stored K/V pairs/s", "kv_store/pairs_per_s", "{:.2f}"),
                        ("speed-up", "speedup_kv_store", X2),
                        ("speed-up, K/V in memory", "speedup_kv_cached", X2),
                    ),
                    key="document tokens",
                ),
            ),
        ),
        Claim(
            "progressive_prefill.json",
            "Progressive prefill, 25 passages",
            "Serving path, recompute reranker on the drafter, Gemma 3 270M verifier; off against on per question "
            "(the machine shared with other jobs).",
            (
                Rows(
                    "summary",
                    (
                        ("first draft token", "first_draft_token_s", S2),
                        ("after reranking", "after_rerank_s", S2),
                        ("total", "total_s", S2),
                        ("cached prompt tokens", "drafting_cache_hit_tokens", "{:.0f}"),
                        ("triggered", "triggered", "{}"),
                    ),
                    key="progressive prefill",
                    keys=("off", "on"),
                ),
            ),
        ),
        Claim(
            "progressive_prefill_16passages.json",
            "Progressive prefill, 16 passages",
            "With four rerank groups the trigger never fired (the file's recorded command wrote "
            "progressive_prefill.json; its note says it was renamed).",
            (
                Rows(
                    "summary",
                    (("first draft token", "first_draft_token_s", S2), ("triggered", "triggered", "{}")),
                    key="progressive prefill",
                    keys=("off", "on"),
                ),
            ),
        ),
        Claim(
            "ask_progressive.json",
            "Progressive prefill in `ask`",
            "`specrag ask ... --rerank kv` with and without `--progressive-prefill`, each a new process over one "
            "K/V store: the same answer, documents and drafts, and no time saved.",
            (
                Rows("mean", (("answer s", "total_s", S2), ("rerank s", "rerank_s", S2)), key="progressive"),
                Figures(
                    (
                        ("on / off", "on_over_off_total", F3),
                        ("identical answers, documents and drafts", "identical_answers_documents_drafts", "{}"),
                    )
                ),
            ),
        ),
    ),
)
