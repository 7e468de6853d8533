"""The pipeline on the real tiny models: packed verification = separate passes, batched = single drafting."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.drafting import Draft, write_drafts
from specrag_jax.pipeline.prompts import occurs_in_passages
from specrag_jax.pipeline.verification import verify_drafts

pytestmark = pytest.mark.slow

DOCS = [
    {"id": "a", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "b", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine."},
    {"id": "c", "title": "Berlin", "text": "Berlin is the capital of Germany."},
]
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smol():
    return TextModel.load("smollm2-135m-instruct", max_seq_len=1024, max_batch=3)


def test_packed_verification_equals_separate_passes(smol):
    drafts = [
        Draft(i, [], "", r, a, True, -1.0, 3)
        for i, (r, a) in enumerate(
            [
                ("The first document says Paris is the capital of France.", "Paris"),
                ("Lyon is in France.", "Lyon"),
                ("garbage \x00 ## ## Response", ""),
            ]
        )
    ]
    verify_drafts(smol, QUESTION, drafts)  # one packed pass
    for d in drafts:
        alone = Draft(d.index, [], "", d.rationale, d.answer, True, -1.0, 3)
        verify_drafts(smol, QUESTION, [alone])  # its own pass
        np.testing.assert_allclose(
            [d.sc_logprob, d.sr_logprob, d.sr_no_logprob],
            [alone.sc_logprob, alone.sr_logprob, alone.sr_no_logprob],
            atol=1e-4,
        )
        assert d.sc_tokens == alone.sc_tokens
    assert drafts[0].sc_logprob > drafts[2].sc_logprob or drafts[2].sc_tokens > drafts[0].sc_tokens
    assert smol.runner.allocator.num_free == smol.runner.allocator.num_usable


def test_batched_drafting_equals_drafting_each_subset_alone(smol):
    subsets = [[DOCS[0], DOCS[2]], [DOCS[1], DOCS[2]], [DOCS[0]]]
    batched, stats = write_drafts(smol, QUESTION, subsets, max_rationale_tokens=24, max_answer_tokens=8)
    assert stats["drafter_shared_prefix_tokens"] > 0
    for i, s in enumerate(subsets):
        [alone], _ = write_drafts(smol, QUESTION, [s], max_rationale_tokens=24, max_answer_tokens=8)
        assert (alone.rationale, alone.answer) == (batched[i].rationale, batched[i].answer)
        assert alone.draft_logprob == pytest.approx(batched[i].draft_logprob, abs=1e-4)
        # the +ground selections' check: the answer occurs in the draft's own passages
        answered = bool(batched[i].rationale and batched[i].answer)
        assert batched[i].grounded is (answered and occurs_in_passages(batched[i].answer, s))
    assert smol.runner.allocator.num_free == smol.runner.allocator.num_usable
