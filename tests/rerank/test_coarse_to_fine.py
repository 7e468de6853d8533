"""Coarse-to-fine reranking against a brute-force full rerank (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.rerank.coarse_to_fine import rerank_coarse_to_fine, summarize_rerank

SCORES = st.lists(st.one_of(st.integers(-3, 3).map(float), st.just(math.nan)), max_size=40)


def docs_of(scores):
    return [{"id": str(i), "text": f"doc {i}", "s": s} for i, s in enumerate(scores)]


class Scorer:
    """Scores each doc with its ``s``; records the groups it was asked for."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def score(self, question, docs):
        self.calls.append([d["id"] for d in docs])
        return [d["s"] for d in docs]


def brute_top(scores, n_docs):
    """Full rerank: by score (NaN lowest), ties in coarse order."""
    keyed = [(-(s if s == s else -math.inf), i) for i, s in enumerate(scores)]
    return [i for _, i in sorted(keyed)[:n_docs]]


def rule_holds(scores, n_docs, group, patience, groups):
    """The top set after ``groups`` groups equals the one after each of the ``patience`` groups before."""
    if groups <= patience:
        return False
    sets = {frozenset(brute_top(scores[: g * group], n_docs)) for g in range(groups - patience, groups + 1)}
    return len(sets) == 1


@settings(max_examples=300, deadline=None)
@given(SCORES, st.integers(1, 12), st.integers(1, 12), st.one_of(st.integers(1, 5), st.just(math.inf)))
def test_matches_the_static_rule_and_brute_force(scores, n_docs, group, patience):
    scorer = Scorer()
    top, trace = rerank_coarse_to_fine("q", docs_of(scores), scorer.score, n_docs, group, patience)
    scored = trace["candidates_scored"]
    groups = trace["groups_scored"]
    # groups go to the scorer in coarse order, `group` at a time
    assert [i for call in scorer.calls for i in call] == [str(i) for i in range(scored)]
    assert all(len(c) == group for c in scorer.calls[:-1]) and len(scorer.calls) == groups
    # the result is the full rerank of the scored prefix, in fine order, with its scores
    assert [int(d["id"]) for d in top] == brute_top(scores[:scored], n_docs)
    assert all(d["rerank_score"] == d["s"] or math.isnan(d["s"]) for d in top)
    # it stops at the first group where the rule holds, else scores everything
    assert trace["early"] == (scored < len(scores))
    if trace["early"]:
        assert rule_holds(scores, n_docs, group, patience, groups)
    assert not any(rule_holds(scores, n_docs, group, patience, g) for g in range(1, groups))
    assert trace["saved_fraction"] == pytest.approx(1 - scored / len(scores) if scores else 0.0)
    assert trace["stopped_at"] == scored and trace["groups_total"] == -(-len(scores) // group)
    if patience == math.inf:  # no early stop: the full rerank
        assert scored == len(scores) and [int(d["id"]) for d in top] == brute_top(scores, n_docs)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=40),
    st.integers(1, 12),
    st.integers(1, 12),
    st.integers(1, 4),
)
def test_more_patience_never_scores_less(scores, n_docs, group, patience):
    _, low = rerank_coarse_to_fine("q", docs_of(scores), Scorer().score, n_docs, group, patience)
    _, high = rerank_coarse_to_fine("q", docs_of(scores), Scorer().score, n_docs, group, patience + 1)
    assert high["candidates_scored"] >= low["candidates_scored"]


def test_stops_once_the_top_set_is_stable():
    scores = [9, 8, 1, 1, 0, 0, 0, 0, 7.5, 9.5]
    top, trace = rerank_coarse_to_fine("q", docs_of(scores), Scorer().score, n_docs=2, group=2, patience=2)
    assert [d["id"] for d in top] == ["0", "1"] and trace["groups_scored"] == 3 and trace["early"]
    assert trace["saved_fraction"] == pytest.approx(0.4)
    top, trace = rerank_coarse_to_fine("q", docs_of(scores), Scorer().score, n_docs=2, group=2, patience=math.inf)
    assert [d["id"] for d in top] == ["9", "0"] and not trace["early"]
    report = summarize_rerank([trace, {**trace, "saved_fraction": 0.5, "early": True}])
    assert report["saved_fraction"] == 0.25 and report["early_fraction"] == 0.5 and report["groups_scored"] == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_docs=0), "n_docs must be >= 1"),
        (dict(group=0), "group size must be >= 1"),
        (dict(patience=0), "patience must be >= 1"),
    ],
)
def test_bad_options(kwargs, message):
    args = {"n_docs": 2, "group": 2, "patience": 2, **kwargs}
    with pytest.raises(SpecRagError, match=message):
        rerank_coarse_to_fine("q", docs_of([1.0]), Scorer().score, **args)


def test_wrong_number_of_scores():
    with pytest.raises(SpecRagError, match="returned 1 scores for 2 documents"):
        rerank_coarse_to_fine("q", docs_of([1.0, 2.0]), lambda q, d: [0.0], 1, 2, 2)
