"""Coarse-to-fine reranking with early termination (Omnia's static rule).

Candidates arrive in coarse order (BM25 rank, or the order passages came with the question). The fine scorer
(a decoder reranker) scores them in groups of ``group`` in that order. After each group the fine top-``n_docs``
set is compared with the set after the previous group; scoring stops when the set has not changed for
``patience`` consecutive groups, or when the candidates run out. While fewer than ``n_docs`` candidates are
scored the set grows with every group, so it never counts as stable. ``patience=math.inf`` scores everything
(the full rerank). The result is the fine top ``n_docs`` of the scored candidates in fine-score order (ties:
coarse order); a NaN score ranks last.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from specrag_jax.errors import SpecRagError

ScoreFn = Callable[[str, Sequence[dict]], Sequence[float]]
GroupFn = Callable[[list[dict], int, bool], None]  # (fine top n_docs so far, stable groups, last group) per group


def check_rerank_options(n_docs: int, group: int, patience: float, n_coarse: int | None = None) -> None:
    """One-line errors for out-of-range options (``patience`` may be ``math.inf``)."""
    if n_docs < 1:
        raise SpecRagError(f"n_docs must be >= 1 (got {n_docs})")
    if group < 1:
        raise SpecRagError(f"rerank group size must be >= 1 (got {group})")
    if not patience >= 1:
        raise SpecRagError(f"rerank patience must be >= 1 group (got {patience})")
    if n_coarse is not None and n_coarse < 1:
        raise SpecRagError(f"n_coarse (candidates to rerank) must be >= 1 (got {n_coarse})")


def _key(score: float) -> float:
    return -math.inf if math.isnan(score) else score


def fine_order(scores: Sequence[float]) -> list[int]:
    """Indices by fine score, best first; ties keep coarse (index) order, NaN last."""
    return sorted(range(len(scores)), key=lambda i: (-_key(scores[i]), i))


def rerank_coarse_to_fine(
    question: str,
    candidates: Sequence[dict],
    score_fn: ScoreFn,
    n_docs: int,
    group: int = 10,
    patience: float = 2,
    on_group: GroupFn | None = None,
) -> tuple[list[dict], dict[str, Any]]:
    """The fine top ``n_docs`` of ``candidates`` (copies with ``rerank_score``) and a trace.

    ``score_fn(question, docs)`` returns one score per doc, higher = more relevant. Trace keys: ``candidates``,
    ``groups_total``, ``groups_scored``, ``candidates_scored``, ``stopped_at`` (coarse rank where scoring
    stopped), ``early`` (stopped before the candidates ran out), ``stable_groups`` and ``saved_fraction``
    (share of the candidates whose fine scoring was skipped). ``on_group(top, stable, last)``, when given, sees
    the provisional top ``n_docs`` (as returned), the stable-group count and whether scoring stops here, after
    every group (progressive prefill)."""
    check_rerank_options(n_docs, group, patience)
    cands = list(candidates)
    scores: list[float] = []
    groups_total = -(-len(cands) // group)
    previous: frozenset[int] | None = None
    stable = 0
    groups = 0
    for start in range(0, len(cands), group):
        chunk = cands[start : start + group]
        got = [float(s) for s in score_fn(question, chunk)]
        if len(got) != len(chunk):
            raise SpecRagError(f"the reranker returned {len(got)} scores for {len(chunk)} documents")
        scores += got
        groups += 1
        top = frozenset(fine_order(scores)[:n_docs])
        stable = stable + 1 if top == previous else 0
        previous = top
        if on_group is not None:
            on_group(
                [{**cands[i], "rerank_score": scores[i]} for i in fine_order(scores)[:n_docs]],
                stable,
                stable >= patience or start + group >= len(cands),
            )
        if stable >= patience:
            break
    order = fine_order(scores)[:n_docs]
    n = len(cands)
    trace = {
        "candidates": n,
        "groups_total": groups_total,
        "groups_scored": groups,
        "candidates_scored": len(scores),
        "stopped_at": len(scores),
        "early": len(scores) < n,
        "stable_groups": stable,
        "saved_fraction": (n - len(scores)) / n if n else 0.0,
    }
    return [{**cands[i], "rerank_score": scores[i]} for i in order], trace


def summarize_rerank(traces: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Early-termination report over questions: means of saved fraction, groups and candidates scored."""
    if not traces:
        return {"questions": 0}
    n = len(traces)
    return {
        "questions": n,
        "saved_fraction": sum(t["saved_fraction"] for t in traces) / n,
        "groups_scored": sum(t["groups_scored"] for t in traces) / n,
        "candidates_scored": sum(t["candidates_scored"] for t in traces) / n,
        "candidates": sum(t["candidates"] for t in traces) / n,
        "early_fraction": sum(bool(t["early"]) for t in traces) / n,
        "rerank_s": sum(float(t.get("rerank_s", 0.0)) for t in traces) / n,
    }
