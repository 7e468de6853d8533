"""Prompt-lookup proposer: matches, order, de-duplication, limits, errors; equal to a brute-force scan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.models.speculative.ngram_proposer import NgramProposer
from specrag_jax.models.speculative.tree import build_tree


def brute_force(context: list[int], max_ngram: int, min_ngram: int, length: int, limit: int) -> list[list[int]]:
    out, starts = [], set()
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(context):
            continue
        suffix = context[-n:]
        for i in range(len(context) - n - 1, -1, -1):
            if context[i : i + n] == suffix and i + n not in starts:
                starts.add(i + n)
                out.append(context[i + n : i + n + length])
                if len(out) == limit:
                    return out
    return out


def test_copies_what_followed_the_last_trigram():
    ctx = [1, 2, 3, 4, 5, 9, 7, 1, 2, 3]
    assert NgramProposer(length=4, max_proposals=1)(ctx) == [[4, 5, 9, 7]]


def test_longest_match_first_then_most_recent():
    ctx = [5, 6, 7, 10, 11, 9, 7, 20, 6, 7, 30, 6, 7]
    # trigram [30, 6, 7]: no match; bigram [6, 7] at 8, then 1; unigram [7] adds only the start after 6.
    assert NgramProposer(length=2, max_proposals=8)(ctx) == [[30, 6], [10, 11], [20, 6]]


def test_same_start_not_repeated_and_limit():
    ctx = [1, 2, 3, 8, 1, 2, 3, 9, 1, 2, 3]
    # The trigram matches at 4 and 0; the bigram and unigram matches end there too: same starts, skipped.
    assert NgramProposer(length=1, max_proposals=8)(ctx) == [[9], [8]]
    assert NgramProposer(length=1, max_proposals=1)(ctx) == [[9]]


def test_no_match_and_short_contexts():
    assert NgramProposer()([1, 2, 3, 4]) == []
    assert NgramProposer()([]) == [] and NgramProposer()([5]) == []
    assert NgramProposer()([5, 5]) == [[5]]
    assert NgramProposer(length=5)([1, 2, 1]) == [[2, 1]]  # continuation cut at the end of the context


def test_proposals_build_a_tree():
    ctx = [3, 4, 5, 6, 3, 4, 7, 8, 3, 4]
    props = NgramProposer(length=3)(ctx)
    tree = build_tree(props, root_token=ctx[-1], budget=8)
    assert tree.num_tokens > 1 and len(set(tree.tokens[1:3].tolist())) == 2


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(min_ngram=0), "min_ngram <= max_ngram"),
        (dict(min_ngram=4), "min_ngram <= max_ngram"),
        (dict(length=0), "proposal length must be >= 1"),
        (dict(max_proposals=0), "max_proposals must be >= 1"),
    ],
)
def test_bad_settings(kw, msg):
    with pytest.raises(SpecRagError, match=msg):
        NgramProposer(**kw)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    ctx=st.lists(st.integers(0, 4), max_size=40),
    max_n=st.integers(1, 4),
    length=st.integers(1, 5),
    limit=st.integers(1, 6),
)
def test_equals_brute_force(ctx, max_n, length, limit):
    min_n = 1 if max_n < 3 else 2
    got = NgramProposer(max_ngram=max_n, min_ngram=min_n, length=length, max_proposals=limit)(ctx)
    assert got == brute_force(ctx, max_n, min_n, length, limit)
