"""Draft-lookup and combined proposers: alignment rule, proposals, limits, errors; equal to a brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.models.speculative.draft_proposer import DraftMatch, DraftProposer
from specrag_jax.models.speculative.ngram_proposer import NgramProposer
from specrag_jax.models.speculative.proposers import PROPOSERS, CombinedProposer, make_proposer
from specrag_jax.models.speculative.tree import build_tree


def brute_align(context: list[int], draft: list[int], max_match: int, min_match: int) -> tuple[int, int] | None:
    """(match length, end in draft) of the longest context suffix occurring in draft, earliest; plain Python."""
    for k in range(min(max_match, len(context)), min_match - 1, -1):
        suffix = context[len(context) - k :]
        for i in range(len(draft) - k + 1):
            if draft[i : i + k] == suffix:
                return k, i + k
    return None


def brute_propose(context, drafts, max_match, min_match, length, limit) -> list[list[int]]:
    out: list[list[int]] = []
    for draft in drafts:
        match = brute_align(context, draft, max_match, min_match)
        if match is None:
            continue
        prop = draft[match[1] : match[1] + length]
        if prop and prop not in out:
            out.append(prop)
            if len(out) == limit:
                break
    return out


class Words:
    """A toy word-level tokenizer: each new word gets the next id."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]

    def text(self, ids: list[int]) -> str:
        words = {i: w for w, i in self.ids.items()}
        return " ".join(words[i] for i in ids)


def test_follows_the_draft_after_the_output_drifts_from_its_start():
    tok = Words()
    draft = tok("Paris , the capital of France , is known for the Eiffel Tower .")
    other = tok("The capital is Lyon , a city .")
    prompt = tok("Q: What is the capital of France ? A:")
    prop = DraftProposer([draft, other], length=6)
    # The output opened differently from both drafts; its end re-aligns with the first draft each step.
    out = tok("The answer is Paris ,")
    assert [tok.text(p) for p in prop(prompt + out)] == ["the capital of France , is", "a city ."]
    out = tok("The answer is Paris , France ,")
    assert prop.align(prompt + out)[0] == DraftMatch(draft=0, length=2, end=7)  # "France ," matched
    assert tok.text(prop(prompt + out)[0]) == "is known for the Eiffel Tower"
    # Output has caught up with the draft's end: that draft proposes nothing.
    assert prop(prompt + tok("the Eiffel Tower .")) == []


def test_longest_match_wins_then_earliest():
    draft = [1, 2, 9, 3, 2, 8, 7, 2, 9, 6]
    prop = DraftProposer([draft], length=2)
    assert prop.align([5, 2, 9]) == [DraftMatch(0, 2, 3)]  # [2, 9] at 1 and 7: earliest
    assert prop([5, 2, 9]) == [[3, 2]]
    assert prop.align([7, 2]) == [DraftMatch(0, 2, 8)]  # [7, 2] beats the earlier [2]
    assert prop([4, 2]) == [[9, 3]]  # only [2] matches: first occurrence
    assert prop([4, 5]) == []  # no suffix occurs
    assert DraftProposer([draft], max_match=1, length=1)([7, 2]) == [[9]]  # capped: unigram, earliest


def test_min_match_and_draft_end():
    draft = [1, 2, 3, 4]
    assert DraftProposer([draft], min_match=2)([9, 3]) == []
    assert DraftProposer([draft], min_match=2)([2, 3]) == [[4]]
    # The longest match ends at the draft's end: nothing to propose.
    assert DraftProposer([draft])([3, 4]) == [] and DraftProposer([draft]).align([3, 4])[0].end == 4


def test_one_per_draft_in_order_dedup_and_limit():
    drafts = [[5, 1, 2], [7, 1, 2], [5, 3, 3], [], [5, 1, 2, 0]]
    ctx = [0, 5]
    assert DraftProposer(drafts)(ctx) == [[1, 2], [3, 3], [1, 2, 0]]
    assert DraftProposer(drafts, max_proposals=2)(ctx) == [[1, 2], [3, 3]]
    assert DraftProposer(drafts, length=1)(ctx) == [[1], [3]]
    assert DraftProposer(drafts).align(ctx)[1] is None and DraftProposer(drafts).align(ctx)[3] is None


def test_empty_inputs():
    assert DraftProposer()([1, 2]) == [] and DraftProposer().align([1]) == []
    assert DraftProposer([[1, 2]])([]) == [] and DraftProposer([[1, 2]]).align([]) == [None]
    assert DraftProposer([[1, 2]])([1]) == [[2]]


def test_matches_never_span_two_drafts():
    drafts = [[4, 5], [6, 7]]  # flat 4 5 6 7: [5, 6] must not match across the boundary
    assert DraftProposer(drafts).align([5, 6]) == [None, DraftMatch(1, 1, 1)]
    assert DraftProposer(drafts)([5, 6]) == [[7]]


def test_drafts_stored_as_tuples_and_hashable():
    import numpy as np

    prop = DraftProposer([np.array([1, 2], np.int32), (3,)])
    assert prop.drafts == ((1, 2), (3,)) and hash(prop) == hash(DraftProposer([[1, 2], [3]]))
    assert DraftProposer(np.array([[1, 2], [3, 4]]))([1]) == [[2]]  # 2-D array: one draft per row
    assert DraftProposer(iter([[1, 2]])).drafts == ((1, 2),)


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"min_match": 0}, "min_match <= max_match"),
        ({"min_match": 5, "max_match": 4}, "min_match <= max_match"),
        ({"length": 0}, "proposal length must be >= 1"),
        ({"max_proposals": 0}, "max_proposals must be >= 1"),
        ({"drafts": [1, 2, 3]}, "draft 0 must be a flat sequence"),
        ({"drafts": [[1], "Paris"]}, "not text"),
        ({"drafts": [[1, 2.5]]}, "draft 0 must be a flat sequence"),
        ({"drafts": [[[1, 2]]]}, "flat sequence"),
        ({"drafts": [[True]]}, "flat sequence"),
        ({"drafts": [[1], [2, -1]]}, "draft 1 has a negative token id"),
        ({"drafts": "Paris"}, "drafts must be a sequence of token-id sequences"),
        ({"drafts": 7}, "drafts must be a sequence of token-id sequences"),
    ],
)
def test_bad_settings(kw, msg):
    with pytest.raises(SpecRagError, match=msg) as err:
        DraftProposer(**kw)
    assert "\n" not in str(err.value)


def test_combined_in_order_dedup():
    ngram = NgramProposer(length=2)
    drafts = DraftProposer([[3, 4, 1, 2], [3, 9, 9]], length=2)
    ctx = [3, 4, 1, 3]
    assert drafts(ctx) == [[4, 1], [9, 9]] and ngram(ctx) == [[4, 1]]
    assert CombinedProposer([drafts, ngram])(ctx) == [[4, 1], [9, 9]]
    assert CombinedProposer([ngram, drafts])(ctx) == [[4, 1], [9, 9]]
    assert CombinedProposer([lambda c: [[1], [], [1]], lambda c: [(2, 3), [1]]])(ctx) == [[1], [2, 3]]
    tree = build_tree(CombinedProposer([drafts, ngram])(ctx), root_token=ctx[-1], budget=8)
    assert tree.num_tokens == 5


def test_make_proposer():
    drafts = [[3, 4, 1, 2]]
    ctx = [3, 4, 1, 3]
    assert PROPOSERS == ("ngram", "drafts", "both")
    ngram = make_proposer("ngram", drafts, length=2)
    assert isinstance(ngram, NgramProposer) and ngram.length == 2
    only = make_proposer("drafts", drafts, draft_options={"length": 3}, length=2)
    assert isinstance(only, DraftProposer) and only(ctx) == [[4, 1, 2]]
    both = make_proposer("both", drafts, draft_options={"length": 1}, length=2)
    assert isinstance(both, CombinedProposer) and both(ctx) == [[4], [4, 1]]
    assert make_proposer("drafts")(ctx) == [] and make_proposer("both")(ctx) == [[4, 1, 3]]


@pytest.mark.parametrize(
    "call,msg",
    [
        (lambda: make_proposer("eagle"), r"unknown proposer 'eagle' \(choose one of ngram, drafts, both\)"),
        (lambda: make_proposer("ngram", ngram=3), "unknown n-gram proposer option.*ngram.*allowed: max_ngram"),
        (lambda: make_proposer("both", draft_options={"size": 2}), "unknown draft proposer option.*size"),
        (lambda: make_proposer("drafts", draft_options={"drafts": [[1]]}), "unknown draft proposer option"),
        (lambda: make_proposer("drafts", [1, 2]), "draft 0 must be a flat sequence"),
        (lambda: make_proposer("both", length=0), "n-gram proposal length must be >= 1"),
        (lambda: CombinedProposer([]), "at least one proposer"),
        (lambda: CombinedProposer([NgramProposer(), 3]), "proposer 1 is not callable"),
    ],
)
def test_bad_names_and_options(call, msg):
    with pytest.raises(SpecRagError, match=msg) as err:
        call()
    assert "\n" not in str(err.value)


tokens = st.integers(0, 3)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    ctx=st.lists(tokens, max_size=30),
    drafts=st.lists(st.lists(tokens, max_size=25), max_size=5),
    max_match=st.integers(1, 6),
    min_match=st.integers(1, 3),
    length=st.integers(1, 5),
    limit=st.integers(1, 6),
)
def test_equals_brute_force(ctx, drafts, max_match, min_match, length, limit):
    min_match = min(min_match, max_match)
    prop = DraftProposer(drafts, max_match=max_match, min_match=min_match, length=length, max_proposals=limit)
    matches = prop.align(ctx)
    assert len(matches) == len(drafts)
    for d, (draft, match) in enumerate(zip(drafts, matches, strict=True)):
        expect = brute_align(ctx, draft, max_match, min_match)
        assert (None if match is None else (match.length, match.end)) == expect
        if match is None:
            continue
        k, end = match.length, match.end
        # The match is an occurrence of the context's k-suffix, and no longer suffix (within max_match) occurs.
        assert match.draft == d and min_match <= k <= min(max_match, len(ctx))
        assert draft[end - k : end] == ctx[len(ctx) - k :]
        assert all(
            ctx[len(ctx) - j :] != draft[i : i + j]
            for j in range(k + 1, min(max_match, len(ctx)) + 1)
            for i in range(len(draft) - j + 1)
        )
    props = prop(ctx)
    assert props == brute_propose(ctx, drafts, max_match, min_match, length, limit)
    # Each proposal is the slice of a draft right after that draft's match.
    for p in props:
        assert any(
            m is not None
            and list(drafts[m.draft][m.end : m.end + len(p)]) == p
            and len(p) == min(length, len(drafts[m.draft]) - m.end)
            for m in matches
        )
    assert len(props) <= limit and len({tuple(p) for p in props}) == len(props)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(ctx=st.lists(tokens, max_size=20), drafts=st.lists(st.lists(tokens, max_size=15), max_size=3))
def test_combined_is_ordered_union(ctx, drafts):
    parts = [DraftProposer(drafts, length=3), NgramProposer(length=3)]
    expect: list[list[int]] = []
    for p in (q for part in parts for q in part(ctx)):
        if p not in expect:
            expect.append(p)
    assert (
        CombinedProposer(parts)(ctx)
        == expect
        == make_proposer("both", drafts, draft_options={"length": 3}, length=3)(ctx)
    )
