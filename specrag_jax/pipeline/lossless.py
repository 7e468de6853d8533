"""Lossless mode: the verifier's own standard-RAG answer, decoded with token-tree speculation.

The proposals come from the drafter's drafts (their answers and rationales, re-tokenised with the
verifier's tokenizer, aligned to the generated text by the longest suffix match: ``DraftProposer``) and from
n-gram lookup in the prompt (which holds the evidence) and the output so far (``NgramProposer``). The
answer is the verifier's: greedy output equals ``standard`` token for token (tested), sampled output keeps
its distribution; the drafts only change how many verifier steps it takes.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.speculative.decode import Speculation, SpeculationStats, combine_stats, merge_stats
from specrag_jax.models.speculative.proposers import PROPOSERS, make_proposer
from specrag_jax.models.speculative.tree import check_budget, default_tree_budget
from specrag_jax.models.tokenizer.base import Tokenizer
from specrag_jax.pipeline.drafting import Draft


def check_proposer(name: str) -> str:
    """``name`` if it is a known proposer, else a one-line error."""
    if name not in PROPOSERS:
        raise SpecRagError(f"unknown proposer {name!r} (choose one of {', '.join(PROPOSERS)})")
    return name


def check_lossless(proposer: str, budget: int) -> None:
    check_proposer(proposer)
    check_budget(budget)


def needs_drafts(proposer: str) -> bool:
    return proposer in ("drafts", "both")


def draft_token_streams(tokenizer: Tokenizer, drafts: Sequence[Draft], shared: bool = False) -> list[list[int]]:
    """Each draft's answer and rationale as verifier token ids, with and without a leading space (a word
    starts a token differently at the start of a reply and after other words). ``shared``: the drafter shares the
    verifier's vocabulary, so a draft's own ids are used as they are (a draft without them is re-encoded)."""
    streams: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for d in drafts:
        own = d.shared_ids() if shared else None
        if own is not None:
            for ids in (own[1], own[0]):
                if ids and tuple(ids) not in seen:
                    seen.add(tuple(ids))
                    streams.append(list(ids))
            continue
        for text in (d.answer, d.rationale):
            text = (text or "").strip()
            for variant in (text, " " + text):
                ids = tokenizer.encode(variant) if text else []
                if ids and tuple(ids) not in seen:
                    seen.add(tuple(ids))
                    streams.append(ids)
    return streams


def lossless_speculation(
    tokenizer: Tokenizer,
    drafts: Sequence[Draft],
    proposer: str = "both",
    budget: int | None = None,
    shared: bool = False,
) -> Speculation:
    """The verifier's ``Speculation`` for one answer: ``proposer`` (ngram, drafts, both) over these drafts, trees of
    up to ``budget`` tokens (default: the platform's, ``tree.default_tree_budget``); ``shared``: the drafts' own
    token ids are proposed as they are (``draft_token_streams``)."""
    budget = default_tree_budget() if budget is None else budget
    check_lossless(proposer, budget)
    streams = draft_token_streams(tokenizer, drafts, shared) if needs_drafts(proposer) else []
    return Speculation(make_proposer(proposer, streams), budget)


def speculation_trace(stats: SpeculationStats | None) -> dict:
    """The trace's ``speculation`` entry: raw counts (summable over questions) and the per-step ratios."""
    stats = stats or SpeculationStats()
    return {"counts": dataclasses.asdict(stats), **combine_stats([stats])}


def summarize_speculation(traces: Sequence[dict]) -> dict:
    """The eval JSON's ``methods.<m>.speculation`` over every question's trace entry (public contract keys:
    ``steps``, ``accepted_tokens_per_step``, ``proposed_tokens_per_step``)."""
    total = merge_stats([SpeculationStats(**t["counts"]) for t in traces])
    return {**combine_stats([total]), "emitted_tokens": total.emitted, "questions": len(traces)}
