"""eval's draft summary: parsed, short-response, format-following and correct shares of the drafts."""

from __future__ import annotations

import pytest

from specrag_jax.evaluation.run import SHORT_RESPONSE_WORDS, draft_format
from specrag_jax.pipeline.drafting import Draft


def _draft(answer: str, parsed: bool = True) -> Draft:
    return Draft(
        index=0,
        doc_ids=[],
        text="",
        rationale="r" if parsed else "",
        answer=answer,
        parsed=parsed,
        draft_logprob=0.0,
        draft_tokens=1,
    )


def test_shares_over_all_drafts():
    long = " ".join(["word"] * (SHORT_RESPONSE_WORDS + 1))
    verified = [
        ([_draft("Paris"), _draft(long + " Paris")], {"ground_truth": ["Paris"]}),
        ([_draft("Rome", parsed=False), _draft("Lyon")], {"ground_truth": ["Berlin"]}),
    ]
    out = draft_format(verified)
    assert out["n"] == 4
    assert out["parsed"] == pytest.approx(0.75)
    assert out["short_response"] == pytest.approx(0.75)
    assert out["follows_format"] == pytest.approx(0.5)  # the long one and the unparsed one do not
    assert out["correct"] == pytest.approx(0.5)
    assert out["response_words_mean"] == pytest.approx((1 + SHORT_RESPONSE_WORDS + 2 + 1 + 1) / 4)


def test_no_drafts():
    assert draft_format([([], {"ground_truth": ["x"]})]) == {"n": 0}


def test_closed_set_drafts_are_scored_by_their_task():
    row = {
        "ground_truth": ["B"],
        "task": "arc_c",
        "choices": [{"label": "A", "text": "cat"}, {"label": "B", "text": "dog"}],
    }
    out = draft_format([([_draft("B"), _draft("A cat with a dog")], row)])  # substring match would count both
    assert out["correct"] == pytest.approx(0.5)
