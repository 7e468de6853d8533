"""Evidence-aware verification, answer-level aggregation and the cascade's confidence (issue 21)."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.run import evaluate
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import EVIDENCE_REFLECTION_PROMPT, evidence_block
from specrag_jax.pipeline.selection import (
    EVIDENCE_TERMS,
    SELECTIONS,
    ScoreOptions,
    best_answer,
    certain_fallback,
    check_selection,
    score_drafts,
    select,
    selection_confidence,
    selection_scores,
    support,
    support_bound,
)
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.pipeline.verification import verify_drafts
from specrag_jax.pipeline.verifier_prompts import evidence_scoring_prompt
from specrag_jax.serving.tiny import tiny_text_model

CHATML = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
DOCS = [
    {"id": "a", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "b", "title": "Lyon", "text": "Lyon is a city in France."},
    {"id": "c", "title": "", "text": "Marseille has a port."},
]


def draft(i, answer, ev_yes=-0.1, ev_no=-2.5, ev_sc=-3.0, dlp=-2.0, parsed=True):
    d = Draft(i, [DOCS[i % 3]["id"]], "", "because", answer, parsed, dlp, 4)
    d.ev_sc_logprob, d.ev_sc_tokens, d.ev_sr_logprob, d.ev_sr_no_logprob = ev_sc, 6, ev_yes, ev_no
    return d


def test_answer_level_aggregation_pools_agreeing_drafts():
    drafts = [
        draft(0, "Lyon", ev_yes=-0.05, ev_no=-3.0),
        draft(1, "Paris", ev_yes=-0.4, ev_no=-1.1),
        draft(2, "the Paris", ev_yes=-0.3, ev_no=-1.3),
        draft(3, "paris.", ev_yes=-0.5, ev_no=-1.0),
    ]
    assert select(copy.deepcopy(drafts), "evidence", ScoreOptions()).answer == "Lyon"  # the single best draft
    chosen = select(drafts, "evidence+agg", ScoreOptions())
    assert chosen.index == 2  # Paris pools three drafts; its best-scoring draft represents it
    pooled = math.log(sum(math.exp(d.score) for d in drafts[1:]))
    assert pooled > drafts[0].score


def test_aggregation_ignores_unparsed_drafts_and_falls_back_to_best():
    drafts = [draft(0, "x", parsed=False), draft(1, "y", parsed=False)]
    score_drafts(drafts, ScoreOptions(terms=("ev_sr",)))
    assert best_answer(drafts).index == 0


def test_support_weights_agreement_by_evidence_yes():
    drafts = [
        draft(0, "Paris", ev_yes=math.log(0.9), ev_no=math.log(0.1)),
        draft(1, "Paris", ev_yes=math.log(0.6), ev_no=math.log(0.4)),
        draft(2, "Lyon"),
    ]
    assert support(drafts[0], drafts) == pytest.approx((0.9 + 0.6) / 3)
    assert support(draft(0, "x", parsed=False), drafts) == 0.0
    chosen = select(drafts, "evidence+agg", ScoreOptions())
    assert selection_confidence(chosen, drafts, "evidence+agg") == pytest.approx(0.5)
    assert 0.0 <= selection_confidence(chosen, drafts, "rho") <= 1.0


def test_selection_names_and_terms():
    assert selection_scores("evidence", ScoreOptions(normalize="sum")).terms == EVIDENCE_TERMS == ("ev_sr",)
    assert selection_scores("rho+agg", ScoreOptions(terms=("sc",))).terms == ("sc",)
    for bad in ("best", "", "evidence+"):
        with pytest.raises(SpecRagError, match=re.escape(f"unknown selection {bad!r}; choose one of rho, evidence")):
            check_selection(bad)
    with pytest.raises(SpecRagError, match="unknown selection"):
        RAGConfig(selection="vote").check()
    base = ("rho", "evidence", "rho+agg", "evidence+agg")
    assert SELECTIONS == base + tuple(f"{b}+ground" for b in base)
    for bad in ("evidence+ground+agg", "ground", "rho+ground+ground"):
        with pytest.raises(SpecRagError, match="unknown selection"):
            check_selection(bad)


@pytest.fixture(scope="module", params=["plain", "chat"])
def verifier(request):
    model = tiny_text_model("tiny:qwen2")
    if request.param == "chat":
        model.tokenizer.chat_template = CHATML
        model.instruct = True
    return model, request.param == "chat"


def test_evidence_prompt_puts_the_passages_between_question_and_draft(verifier):
    model, chat = verifier
    form = evidence_scoring_prompt(model.tokenizer, "Q?", chat)
    assert form.prefix.endswith("## Evidence:\n") and EVIDENCE_REFLECTION_PROMPT in form.after
    if chat:
        assert form.before_draft == "\n<|assistant|>" and form.yes == "Yes"


def test_packed_evidence_pass_equals_one_branch_at_a_time(verifier):
    model, chat = verifier
    drafts = [
        Draft(i, [DOCS[i]["id"], DOCS[(i + 1) % 3]["id"]], "", f"Doc {i} says so.", a, True, -1.0, 3)
        for i, a in enumerate(["Paris", "Lyon", "Marseille"])
    ]
    evidence = [[DOCS[i], DOCS[(i + 1) % 3]] for i in range(3)]
    trace = verify_drafts(model, "Which city?", drafts, chat=chat, evidence=evidence)
    assert trace["evidence_tree_tokens"] > sum(
        len(model.tokenizer.encode(evidence_block(e), add_bos=False)) for e in evidence
    )
    for d, docs in zip(drafts, evidence):
        alone = copy.deepcopy(d)
        verify_drafts(model, "Which city?", [alone], chat=chat, evidence=[docs])
        for field in ("ev_sc_logprob", "ev_sr_logprob", "ev_sr_no_logprob"):
            np.testing.assert_allclose(getattr(alone, field), getattr(d, field), rtol=1e-4, atol=1e-4)
        assert alone.ev_sc_tokens == d.ev_sc_tokens and d.sc_tokens == 0  # the plain terms are untouched
    swapped = copy.deepcopy(drafts[0])
    verify_drafts(model, "Which city?", [swapped], chat=chat, evidence=[[DOCS[2]]])
    assert swapped.ev_sr_logprob != drafts[0].ev_sr_logprob  # the passages are read
    with pytest.raises(SpecRagError, match="one passage list per draft"):
        verify_drafts(model, "Which city?", drafts, chat=chat, evidence=evidence[:2])


def test_speculative_with_evidence_selection_and_the_cascade_fallback(verifier):
    model, chat = verifier
    subsets = lambda q, docs, k, m, s: ([[0, 1], [1, 2], [2, 0]], {})  # noqa: E731
    cfg = RAGConfig(
        m=3,
        max_draft_tokens=6,
        max_answer_tokens=4,
        selection="evidence+agg",
        tau_min=None,
        verifier_prompt="chat" if chat else "plain",
    )
    rag = SpecRAG(model, model, subsets=subsets, config=cfg)
    res = rag.answer("Which city?", docs=DOCS, method="speculative")
    assert "evidence_verification_s" in res.trace and "verification_s" not in res.trace
    assert res.trace["selection"] == "evidence+agg" and res.trace["path"] == "verified_draft"
    assert res.trace["confidence"] == pytest.approx(
        selection_confidence(
            next(d for d in res.drafts if d.index == res.trace["chosen_draft"]), res.drafts, "evidence+agg"
        )
    )
    cfg.tau_min = 1.0  # no draft can clear it: the answer is standard RAG's, decoded through the lossless path
    fb = rag.answer("Which city?", docs=DOCS, method="speculative")
    std = rag.answer("Which city?", docs=DOCS, method="standard")
    assert fb.trace["path"] == "fallback" and fb.answer == std.answer and "speculation" in fb.trace


_DRAFTS = st.lists(
    st.tuples(
        st.sampled_from(["Paris", "paris.", "The Paris", "Lyon", "", "x"]),
        st.booleans(),
        st.floats(-30.0, 0.0),
        st.floats(-30.0, 0.0),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(_DRAFTS)
def test_support_never_exceeds_its_bound_and_the_bound_is_reached(spec):
    drafts = [draft(i, a, ev_yes=y, ev_no=n, parsed=ok) for i, (a, ok, y, n) in enumerate(spec)]
    bound = support_bound(drafts)
    assert all(support(d, drafts) <= bound + 1e-12 for d in drafts)
    for d in drafts:  # a verifier certain of every draft (P(Yes | Yes or No) = 1) reaches the bound
        d.ev_sr_logprob, d.ev_sr_no_logprob = 0.0, -1e4
    assert max(support(d, drafts) for d in drafts) == pytest.approx(bound)


def test_certain_fallback_only_for_evidence_selections_under_tau_min():
    drafts = [draft(0, "Paris"), draft(1, "The Paris"), draft(2, "Lyon"), draft(3, "Nice"), draft(4, "x", parsed=False)]
    assert support_bound(drafts) == pytest.approx(0.4) and support_bound([]) == 0.0
    assert certain_fallback(drafts, "evidence", 0.5) == pytest.approx(0.4)
    assert certain_fallback(drafts, "evidence+agg", 0.5) == pytest.approx(0.4)
    assert certain_fallback(drafts, "evidence", 0.4) is None  # 0.4 can still be reached
    assert certain_fallback(drafts, "evidence", None) is None
    assert certain_fallback(drafts, "rho", 0.99) is None  # rho's confidence is not bounded by agreement


@pytest.mark.parametrize("tau_min", [0.0, 0.5, 1.0])
def test_early_fallback_skips_verification_and_keeps_the_answer(verifier, tau_min):
    model, chat = verifier
    subsets = lambda q, docs, k, m, s: ([[0, 1], [1, 2], [2, 0]], {})  # noqa: E731
    kw = dict(m=3, max_draft_tokens=6, max_answer_tokens=4, selection="evidence", tau_min=tau_min)
    kw["verifier_prompt"] = "chat" if chat else "plain"
    early = SpecRAG(model, model, subsets=subsets, config=RAGConfig(**kw)).answer(
        "Which city?", docs=DOCS, method="speculative"
    )
    full = SpecRAG(model, model, subsets=subsets, config=RAGConfig(**kw, early_fallback=False))
    slow = full.answer("Which city?", docs=DOCS, method="speculative")
    assert (early.answer, early.trace["path"]) == (slow.answer, slow.trace["path"])
    assert "confidence_bound" not in slow.trace and "evidence_verification_s" in slow.trace
    skipped = certain_fallback(early.drafts, "evidence", tau_min)
    verified = "evidence_verification_s" in early.trace
    assert ("confidence_bound" in early.trace) == (skipped is not None) == (not verified)
    if tau_min == 0.0:
        assert skipped is None and early.trace["path"] == "verified_draft"
    if tau_min == 1.0:  # the tiny model's three drafts never all agree: the skip is exercised
        assert skipped is not None
        # eval scores every selection option afterwards, outside the latency, and says so
        row = {"question_id": "q", "question": "Which city?", "ground_truth": ["Paris"], "context": DOCS}
        full.config.early_fallback = True
        res = evaluate(full, [row], ["speculative"], progress=False)
        [pred] = res["predictions"]
        assert pred["path"] == "fallback" and "evidence_verification_s" not in pred["stages_s"]
        assert pred["scored_after_answer"]["evidence_verification_s"] > 0 and set(pred["selections"]) == set(SELECTIONS)
    if skipped is not None:
        assert early.trace["path"] == "fallback" and slow.trace["confidence"] < tau_min
        assert "chosen_draft" not in early.trace and early.trace["confidence_bound"] == skipped
