"""Closed-set questions (ARC-Challenge, PubHealth): their choices/instruction in every prompt, answers parsed to
exact labels, the drafts' labels aggregated; open-ended prompts unchanged byte for byte."""

from __future__ import annotations

import math

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.run import selection_picks
from specrag_jax.pipeline.closed_set import CLAIM_INSTRUCTION, ClosedSet, closed_set, from_row
from specrag_jax.pipeline.drafting import Draft, draft_prompts, write_drafts
from specrag_jax.pipeline.prompts import (
    closed_book_prompt,
    drafter_evidence,
    drafter_prefix,
    standard_rag_prompt,
    verifier_prefix,
)
from specrag_jax.pipeline.selection import ScoreOptions, answer_groups, answer_key, consensus, select, support_bound
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.pipeline.verifier_prompts import evidence_scoring_prompt, scoring_prompt
from specrag_jax.serving.tiny import tiny_text_model

DOCS = [{"title": "Paris", "text": "Paris is in France."}, {"title": "", "text": "Lyon too."}]
ARC = closed_set(
    "arc_c",
    [
        {"label": "A", "text": "oxygen"},
        {"label": "B", "text": "carbon dioxide"},
        {"label": "C", "text": "helium"},
        {"label": "D", "text": "neon"},
    ],
)
CLAIM = closed_set("pubhealth")
HEAD = "Response to the instruction. Also provide rationale for your response.\n## Instruction: "


def test_open_prompts_are_unchanged_byte_for_byte():
    assert drafter_prefix(" Q? ") == HEAD + "Q?\n## Evidence:\n"
    assert drafter_evidence(DOCS) == (
        "[1] Paris\nParis is in France.\n[2] Lyon too.\nWrite '## Rationale:' with a "
        "short explanation based on the evidence, then '## Response:' with a short "
        "answer."
    )
    assert verifier_prefix("Q?") == HEAD + "Q?\n"
    assert standard_rag_prompt("Q?", DOCS) == (
        "Answer the question using the evidence. Give a short answer.\n"
        "## Evidence:\n[1] Paris\nParis is in France.\n[2] Lyon too.\n"
        "## Question: Q?\n## Answer:"
    )
    assert closed_book_prompt("Q?") == "Answer the question. Give a short answer.\n## Question: Q?\n## Answer:"
    tok = tiny_text_model("tiny:llama").tokenizer
    form = scoring_prompt(tok, "Q?", chat=False)
    assert (form.prefix, form.after) == (
        HEAD + "Q?\n",
        "\nDo you think the explanation supports the answers? (Yes or No)\nAnswer:",
    )
    assert evidence_scoring_prompt(tok, "Q?", chat=False).prefix == HEAD + "Q?\n## Evidence:\n"
    assert from_row({"question": "Q?", "ground_truth": ["x"]}) is None
    assert from_row({"question": "Q?", "ground_truth": ["x"], "task": "triviaqa"}) is None


def test_arc_choices_and_claim_instruction_reach_every_prompt():
    choices = "A: oxygen\nB: carbon dioxide\nC: helium\nD: neon\n"
    instruction = "Given 4 answer candidates, A, B, C and D, choose the best answer choice."
    assert ARC.instruction == choices + instruction
    assert drafter_prefix("Which gas?", ARC) == HEAD + "Which gas?\n" + choices + instruction + "\n## Evidence:\n"
    assert drafter_evidence(DOCS, ARC).endswith(
        "'## Response:' with only the letter of the best choice (A, B, C and D)."
    )
    assert drafter_evidence(DOCS, CLAIM).endswith("'## Response:' with true or false.")
    tok = tiny_text_model("tiny:llama").tokenizer
    for closed, text in ((ARC, choices + instruction), (CLAIM, CLAIM_INSTRUCTION)):
        want = HEAD + "Claim.\n" + text + "\n"
        assert verifier_prefix("Claim.", closed) == want
        assert scoring_prompt(tok, "Claim.", False, closed).prefix == want
        assert evidence_scoring_prompt(tok, "Claim.", False, closed).prefix == want + "## Evidence:\n"
        assert standard_rag_prompt("Claim.", DOCS, closed).endswith("## Question: Claim.\n" + text + "\n## Answer:")
        assert closed_book_prompt("Claim.", closed).startswith(f"Answer the question. Give {closed.response_hint}.")


@pytest.mark.parametrize(
    "answer, label",
    [
        ("B", "B"),
        ("(B)", "B"),
        ("B) carbon dioxide", "B"),
        ("The answer is C.", "C"),
        ("Answer: D", "D"),
        ("b", "B"),
        ("c.", "C"),
        ("carbon dioxide", "B"),
        ("It is neon, I think", "D"),
        ("Carbon", ""),
        ("oxygen or helium", ""),
        ("E", ""),
        ("", ""),
    ],
)
def test_arc_label_rule(answer, label):
    assert ARC.parse(answer) == label


@pytest.mark.parametrize(
    "answer, label",
    [
        ("true", "true"),
        ("False.", "false"),
        ("The claim is true", "true"),
        ("SUPPORTS", "true"),
        ("refutes the claim", "false"),
        ("maybe", ""),
    ],
)
def test_claim_label_rule(answer, label):
    assert CLAIM.parse(answer) == label


def test_numeric_arc_labels():
    arc = closed_set("arc_c", [{"label": "1", "text": "up"}, {"label": "2", "text": "down"}])
    assert arc == ClosedSet("arc_c", ("1", "2"), ("up", "down"))
    assert (arc.parse("2"), arc.parse("(1) up"), arc.parse("12")) == ("2", "1", "")


@pytest.mark.parametrize(
    "choices, message",
    [
        (None, "q7: 'choices' is missing: an arc_c question needs its choices"),
        ({"label": ["A"], "text": ["x"]}, "q7: 'choices' must be a list of {label, text} objects"),
        ([{"label": "A", "text": "x"}, {"text": "y"}], "q7: 'choices[1].label' is missing or empty"),
        ([{"label": "A", "text": "x"}, {"label": " ", "text": "y"}], "q7: 'choices[1].label' is missing or empty"),
        ([{"label": "A", "text": 3}], "q7: 'choices[0].text' must be a string"),
        ([{"label": "A", "text": "x"}, {"label": "A", "text": "y"}], "q7: 'choices' labels repeat (A, A)"),
    ],
)
def test_bad_choices_are_one_line_errors(choices, message):
    with pytest.raises(SpecRagError) as err:
        closed_set("arc_c", choices, "q7")
    assert message in str(err.value) and "\n" not in str(err.value)


def _rag(**config) -> SpecRAG:
    model = tiny_text_model("tiny:llama", seed=1, num_pages=128, page_size=16)
    return SpecRAG(
        model,
        model,
        subsets=lambda q, docs, k, m, s: ([[0], [1]], {}),
        config=RAGConfig(max_answer_tokens=4, max_draft_tokens=8, **config),
    )


def test_drafts_and_answers_are_labels():
    rag = _rag()
    prefix, _ = draft_prompts(rag.drafter, "Which gas?", [DOCS[:1]], ARC)
    assert "carbon dioxide" in rag.drafter.tokenizer.decode(prefix)
    drafts, _ = write_drafts(
        rag.drafter, "Which gas?", [DOCS[:1], DOCS[1:]], max_rationale_tokens=8, max_answer_tokens=4, closed=ARC
    )
    for d in drafts:  # a random tiny model rarely writes a label: then the draft keeps its text and is unparsed
        assert d.answer in ARC.labels if d.parsed else ARC.parse(d.answer) == ""
        assert d.grounded is None  # labels are not checked against the passages
    open_drafts, _ = write_drafts(rag.drafter, "Which gas?", [DOCS[:1]], max_rationale_tokens=8, max_answer_tokens=4)
    assert isinstance(open_drafts[0].grounded, bool)
    for method in ("standard", "closed_book", "speculative"):
        answer = rag.answer("Which gas?", DOCS, method, closed_set=ARC).answer
        assert answer in ARC.labels or ARC.parse(answer) == ""
    plain = rag.answer("Which gas?", DOCS, "standard")  # no closed set: the open prompt, fewer tokens
    closed = rag.answer("Which gas?", DOCS, "standard", closed_set=ARC)
    assert closed.trace["verifier_prefill_tokens"] > plain.trace["verifier_prefill_tokens"]


def _labelled(answers_scores: list[tuple[str, float]]) -> list[Draft]:
    return [Draft(i, [str(i)], "", "r", a, True, s, 1) for i, (a, s) in enumerate(answers_scores)]


@pytest.mark.parametrize("ground", ["", "+ground"])
def test_closed_questions_aggregate_the_drafts_labels(monkeypatch, ground):
    rag = _rag(selection="evidence" + ground, tau_min=None)
    # one draft says A with the best single score; two drafts say B, pooling to more (labels are never checked
    # against the passages: +ground changes nothing)
    monkeypatch.setattr(rag, "verify", lambda *a, **k: None)
    picks = {}
    for name, closed in (("open", None), ("closed", ARC)):
        drafts = _labelled([("A", 0.0), ("B", 0.0), ("B", 0.0)])
        for d, p in zip(drafts, (0.6, 0.5, 0.5)):
            d.ev_sr_logprob, d.ev_sr_no_logprob = math.log(p), math.log(1 - p)
        trace: dict = {}
        result = rag._select("Which gas?", DOCS, drafts, trace, 0.0, method="speculative", closed=closed)
        picks[name] = (result.answer, trace["selection"])
    assert picks == {"open": ("A", "evidence" + ground), "closed": ("B", "evidence+agg" + ground)}


def test_the_label_a_is_an_answer_not_an_article():
    """``normalize_answer`` drops articles, so "A" once normalised to "" and its drafts never pooled: three strong
    "A" drafts lost to one weak "B" under aggregation, and unanimous "A" drafts were no consensus."""
    assert answer_key("A") == "a" and answer_key("The Paris") == "paris" and answer_key("") == ""
    drafts = _labelled([("A", 0.0), ("A", 0.0), ("A", 0.0), ("B", 0.0)])
    for d, p in zip(drafts, (0.7, 0.7, 0.7, 0.8)):
        d.ev_sr_logprob, d.ev_sr_no_logprob = math.log(p), math.log(1 - p)
        d.sr_logprob, d.sr_no_logprob = math.log(p), math.log(1 - p)
    assert set(answer_groups(drafts)) == {"a", "b"} and support_bound(drafts) == 0.75
    for option in ("rho+agg", "evidence+agg", "evidence+agg+ground"):
        assert select(drafts, option, ScoreOptions()).answer == "A", option
    assert select(drafts, "evidence", ScoreOptions()).answer == "B"  # the best single draft, without pooling
    assert consensus(drafts[:3]) and not consensus(drafts)
    # eval scores each option as the pipeline runs it: closed-set questions always pool their labels
    assert selection_picks(drafts, closed=True)["evidence"]["answer"] == "A"
    assert selection_picks(drafts, closed=False)["evidence"]["answer"] == "B"
