"""Draft parsing, score combination, consensus and guardrail logic (no model needed)."""

from __future__ import annotations

import math
import re

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import normalize_answer, parse_draft
from specrag_jax.pipeline.selection import ScoreOptions, best, confidence, consensus, score_drafts
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG


def draft(i, answer="Paris", parsed=True, dlp=-2.0, dn=4, sc=-3.0, sn=6, yes=-0.2, no=-2.0):
    return Draft(i, [str(i)], "", "because", answer, parsed, dlp, dn, sc, sn, yes, no)


@pytest.mark.parametrize(
    "text, rationale, answer, ok",
    [
        (" It is in France.\n## Response: Paris\n", "It is in France.", "Paris", True),
        ("## Rationale: x y\n## Response:  42 \n## Rationale: again", "x y", "42", True),
        ("no format at all", "no format at all", "no format at all", False),
        ("", "", "", False),
        ("\x00\x01 ### response", "\x00\x01", "", False),
    ],
)
def test_parse_draft_never_raises(text, rationale, answer, ok):
    p = parse_draft(text)
    assert (p.rationale, p.answer, p.ok) == (rationale, answer, ok)


def test_scores_sum_mean_and_terms():
    d = draft(0)
    score_drafts([d], ScoreOptions(normalize="sum", terms=("draft", "sc"), sr="yes"))
    assert d.score == pytest.approx(-5.0)
    score_drafts([d], ScoreOptions(normalize="mean", terms=("draft", "sc", "sr"), sr="yes"))
    assert d.score == pytest.approx(-0.5 - 0.5 - 0.2)
    score_drafts([d], ScoreOptions(normalize="mean", terms=("sr",), sr="yes_vs_no"))
    assert d.score == pytest.approx(-0.2 - math.log(math.exp(-0.2) + math.exp(-2.0)))


def test_unparsed_draft_loses_and_best_breaks_ties_by_index():
    good, bad = draft(0, dlp=-50.0), draft(1, parsed=False, dlp=-0.1)
    score_drafts([good, bad], ScoreOptions())
    assert best([good, bad]) is good
    a, b = draft(0), draft(1)
    score_drafts([a, b], ScoreOptions())
    assert best([b, a]) is a


def test_consensus_and_confidence():
    assert consensus([draft(0, "The Paris."), draft(1, "paris")])
    assert not consensus([draft(0, "Paris"), draft(1, "Lyon")])
    assert not consensus([draft(0, "Paris"), draft(1, "x", parsed=False)])  # one parsed draft is no consensus
    assert normalize_answer("The  Eiffel-Tower!") == "eiffel tower"
    assert 0.0 < confidence(draft(0)) < 1.0 and confidence(draft(0, parsed=False)) == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(m=0), "m (number of drafts) must be >= 1"),
        (dict(k=0), "k (number of clusters) must be >= 1"),
        (dict(n_docs=0), "n_docs must be >= 1"),
        (dict(tau_min=1.5), "tau_min"),
        (dict(fallback="guess"), "fallback"),
    ],
)
def test_config_out_of_range(kwargs, message):
    with pytest.raises(SpecRagError, match=re.escape(message)):
        RAGConfig(**kwargs).check()


def test_score_options_validation():
    with pytest.raises(SpecRagError, match="terms"):
        ScoreOptions(terms=("draft", "bogus"))
    with pytest.raises(SpecRagError, match="normalize"):
        ScoreOptions(normalize="max")


def test_bad_questions_and_missing_documents():
    rag = SpecRAG(None, None, subsets=lambda *a: ([], {}))  # errors are raised before any model is used
    with pytest.raises(SpecRagError, match="empty question"):
        rag.answer("   ")
    with pytest.raises(SpecRagError, match="no documents given and no corpus"):
        rag.answer("Who?")
    with pytest.raises(SpecRagError, match="no documents"):
        rag.answer("Who?", docs=[])
    with pytest.raises(SpecRagError, match="unknown method"):
        rag.answer("Who?", docs=["x"], method="oracle")
