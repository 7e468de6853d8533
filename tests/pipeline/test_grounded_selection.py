"""``+ground`` selections: only drafts whose answer occurs in their own passages are picked or accepted (issue 21)."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import occurs_in_passages
from specrag_jax.pipeline.selection import (
    SELECTIONS,
    ScoreOptions,
    certain_fallback,
    consensus,
    eligible,
    select,
    selection_confidence,
    support_bound,
    with_agg,
)
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.serving.tiny import tiny_text_model

DOCS = [
    {"id": "a", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "b", "title": "Lyon", "text": "Lyon is a city in France."},
    {"id": "c", "title": "", "text": "Marseille has a port."},
]


def draft(i: int, answer: str, grounded: bool | None, yes: float = 0.9, parsed: bool = True) -> Draft:
    d = Draft(i, [f"d{i}"], "", "because", answer, parsed, -2.0 - i, 4)
    d.ev_sr_logprob, d.ev_sr_no_logprob = math.log(yes), math.log(1.0 - yes)
    d.sc_logprob, d.sc_tokens, d.sr_logprob, d.sr_no_logprob = -3.0, 4, math.log(yes), math.log(1.0 - yes)
    d.grounded = grounded
    return d


def test_ground_picks_the_best_grounded_draft_over_a_better_scored_invention():
    drafts = [draft(0, "1,000", False, yes=0.95), draft(1, "426", True, yes=0.6), draft(2, "12", False, yes=0.9)]
    assert select(copy.deepcopy(drafts), "evidence", ScoreOptions()).index == 0
    chosen = select(drafts, "evidence+ground", ScoreOptions())
    assert chosen.index == 1
    assert selection_confidence(chosen, drafts, "evidence+ground") == pytest.approx(0.6 / 3)


def test_ground_without_a_grounded_draft_picks_as_before_but_never_accepts():
    drafts = [draft(0, "a", False, yes=0.95), draft(1, "b", False, yes=0.5)]
    for option in ("rho", "evidence", "rho+agg", "evidence+agg"):
        plain = select(copy.deepcopy(drafts), option, ScoreOptions())
        chosen = select(drafts, f"{option}+ground", ScoreOptions())
        assert chosen.index == plain.index
        assert selection_confidence(chosen, drafts, option) > 0.0
        assert selection_confidence(chosen, drafts, f"{option}+ground") == 0.0
        # no verification can make such a draft acceptable: the cascade falls back before verifying
        assert certain_fallback(drafts, f"{option}+ground", 0.1) == 0.0
        assert certain_fallback(drafts, f"{option}+ground", None) is None
    assert certain_fallback(drafts, "rho", 0.1) is None  # rho's confidence has no bound from agreement


def test_unchecked_drafts_count_as_grounded():
    """Closed-set labels are not checked (grounded None): +ground changes nothing for them."""
    drafts = [draft(0, "A", None, yes=0.4), draft(1, "B", None, yes=0.8), draft(2, "B", None, yes=0.7)]
    for option in ("rho", "evidence", "rho+agg", "evidence+agg"):
        a, b = copy.deepcopy(drafts), copy.deepcopy(drafts)
        plain, ground = select(a, option, ScoreOptions()), select(b, f"{option}+ground", ScoreOptions())
        assert plain.index == ground.index
        assert selection_confidence(plain, a, option) == selection_confidence(ground, b, f"{option}+ground")
    assert with_agg("evidence+ground") == "evidence+agg+ground"
    assert with_agg("rho") == "rho+agg" and with_agg("rho+agg+ground") == "rho+agg+ground"


def test_support_bound_counts_only_groups_with_a_grounded_draft():
    drafts = [draft(i, a, g) for i, (a, g) in enumerate([("x", False)] * 3 + [("y", True), ("z", False)])]
    assert support_bound(drafts) == pytest.approx(3 / 5)
    assert support_bound(drafts, grounded=True) == pytest.approx(1 / 5)
    assert certain_fallback(drafts, "evidence+ground", 0.5) == pytest.approx(1 / 5)
    assert certain_fallback(drafts, "evidence", 0.5) is None


answers = st.sampled_from(["Paris", "Lyon", "Nice", ""])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(answers, st.sampled_from([True, False, None]), st.floats(0.01, 0.99), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(SELECTIONS),
    st.floats(0.0, 1.0),
)
def test_ground_selections_never_accept_an_ineligible_draft_and_the_early_fallback_is_sound(rows, option, tau):
    drafts = [draft(i, a, g, yes, parsed) for i, (a, g, yes, parsed) in enumerate(rows)]
    chosen = select(drafts, option, ScoreOptions())
    conf = selection_confidence(chosen, drafts, option)
    if option.endswith("+ground"):
        if any(eligible(d) for d in drafts):
            assert eligible(chosen)
        if not eligible(chosen):
            assert conf == 0.0
    bound = certain_fallback(drafts, option, tau)
    if bound is not None:  # skipping verification is only allowed when the chosen draft could not pass
        assert conf <= bound + 1e-9 and conf < tau


def test_pipeline_without_a_grounded_draft_falls_back_before_verifying():
    """The default selection (rho+ground) on a random tiny model, whose drafts never occur in their passages: the
    verification pass is skipped and the answer and path are those of the full cascade."""
    model = tiny_text_model("tiny:qwen2")
    subsets = lambda q, docs, k, m, s: ([[0, 1], [1, 2], [2, 0]], {})  # noqa: E731
    kw = dict(m=3, max_draft_tokens=6, max_answer_tokens=4, selection="rho+ground", tau_min=0.1)
    early = SpecRAG(model, model, subsets=subsets, config=RAGConfig(**kw)).answer(
        "Which city?", docs=DOCS, method="speculative"
    )
    slow = SpecRAG(model, model, subsets=subsets, config=RAGConfig(**kw, early_fallback=False))
    full = slow.answer("Which city?", docs=DOCS, method="speculative")
    for d in early.drafts:
        ids = set(d.doc_ids)
        assert d.grounded == (d.parsed and occurs_in_passages(d.answer, [x for x in DOCS if x["id"] in ids]))
    assert not any(eligible(d) for d in early.drafts)
    assert (early.answer, early.trace["path"]) == (full.answer, full.trace["path"]) == (full.answer, "fallback")
    assert "verification_s" in full.trace and full.trace["confidence"] == 0.0
    assert "verification_s" not in early.trace and early.trace["confidence_bound"] == 0.0


def test_consensus_under_ground_needs_a_grounded_draft():
    """The all-agree fast path accepts unverified: under +ground only when some agreeing draft is grounded."""
    ungrounded = [draft(i, "Lyon", False) for i in range(3)]
    mixed = [draft(0, "Paris", False), draft(1, "Paris", True), draft(2, "Paris", False)]
    assert consensus(ungrounded) and not consensus(ungrounded, grounded=True)
    assert consensus(mixed, grounded=True)
    model = tiny_text_model("tiny:qwen2")
    subsets = lambda q, docs, k, m, s: ([[0, 1], [1, 2], [2, 0]], {})  # noqa: E731
    rag = SpecRAG(model, model, subsets=subsets, config=RAGConfig(selection="rho+ground", tau_min=0.5, consensus=True))
    trace: dict = {}
    result = rag._select("Which city?", DOCS, mixed, trace, 0.0, method="speculative", closed=None)
    assert trace["path"] == "consensus" and result.trace["chosen_draft"] == 1
