"""The pipeline's rerank stage: coarse candidates -> fine reranker in groups with early termination -> n_docs.

``RAGConfig.rerank``: ``"none"`` (the coarse order as it comes), ``"kv"`` (the reranker reads stored document
K/V) or ``"recompute"`` (it recomputes every document). Candidates are the search's top ``n_coarse`` when the
question came without passages, else all the passages it came with; both are reranked to the top ``n_docs``
(``specrag_jax.rerank.coarse_to_fine`` documents the stopping rule).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.progress import Progress
from specrag_jax.rerank.coarse_to_fine import check_rerank_options, rerank_coarse_to_fine

RERANK_MODES = ("none", "kv", "recompute")


class Scorer(Protocol):
    """What the pipeline needs of a reranker (``specrag_jax.rerank.reranker.Reranker``)."""

    def score(self, question: str, docs: Sequence[dict]) -> list[float]: ...


class OneAtATime:
    """A reranker whose calls hold a lock: its model is shared by several threads (questions, requests)."""

    def __init__(self, scorer: Scorer, lock: threading.Lock | None = None) -> None:
        self.scorer, self.lock = scorer, lock or threading.Lock()

    def score(self, question: str, docs: Sequence[dict]) -> list[float]:
        with self.lock:
            return self.scorer.score(question, docs)


class GroupListener(Protocol):
    """Told the provisional fine top set after every rerank group (``pipeline.progressive``)."""

    def on_group(self, top: list[dict], stable: int, last: bool) -> None: ...


def check_rerank(rerank: str, reranker: str | None, n_coarse: int, group: int, patience: float) -> None:
    """One-line errors for the rerank fields of RAGConfig."""
    if rerank not in RERANK_MODES:
        raise SpecRagError(f"unknown rerank mode {rerank!r}; choose one of {', '.join(RERANK_MODES)}")
    if reranker is not None and (not isinstance(reranker, str) or not reranker.strip()):
        raise SpecRagError(f"reranker must be a model name (got {reranker!r})")
    check_rerank_options(1, group, patience, n_coarse)


def rerank_documents(
    question: str,
    candidates: Sequence[dict],
    scorer: Scorer,
    config: Any,
    trace: dict,
    progress: Progress,
    listener: GroupListener | None = None,
) -> list[dict]:
    """The fine top ``config.n_docs`` of ``candidates``; records ``rerank_s`` and ``rerank`` in ``trace``.
    ``listener.on_group(top, stable, last)`` sees the provisional top set after every group (progressive prefill)."""
    progress.start("reranking")
    t = time.perf_counter()
    top, info = rerank_coarse_to_fine(
        question,
        candidates,
        scorer.score,
        config.n_docs,
        config.rerank_group,
        config.rerank_patience,
        on_group=listener and listener.on_group,
    )
    seconds = time.perf_counter() - t
    trace["rerank_s"] = seconds
    trace["rerank"] = {"mode": config.rerank, **info, "rerank_s": seconds}
    progress.end(
        "reranking",
        seconds,
        f"{info['candidates_scored']} of {info['candidates']} candidates in "
        f"{info['groups_scored']} groups{' (stopped early)' if info['early'] else ''}",
    )
    return top
