"""Speculative decoding over token trees for a batch of sequences (the decode phase of ``Generator``).

Each step: every active sequence's proposer looks at its tokens so far and proposes continuations; they
merge into one trie per sequence (``tree.build_tree``, siblings distinct, capped by a budget); all
sequences' trees go through ONE verifier pass (``ModelRunner.speculate``: tree chunks after the cached
K/V, acceptance and K/V compaction on device); each sequence then emits its accepted tokens plus the bonus
token. A step where no sequence has a proposal is a plain decode step. Greedy output equals plain greedy
decoding (up to numerical near-ties: a tree pass and a one-token pass round differently); sampled output
has the verifier's own distribution (``accept``).

The tree budget of a step is the smallest of ``TREE_BUDGETS`` holding the largest trie of the batch, capped
by ``Speculation.max_budget`` (few compiled shapes: budgets x sequence buckets x page buckets).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import pages_needed
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.speculative.tree import (
    TREE_BUDGETS,
    build_tree,
    check_budget,
    count_trie_nodes,
    fit_budget,
    largest_fitting_budget,
    stack_trees,
)

ProposerFn = Callable[[Sequence[int]], list[list[int]]]


@dataclasses.dataclass(frozen=True)
class Speculation:
    """How a ``Generator`` speculates: one proposer for every sequence, or one per prompt (in order), and the
    largest tree budget (chunk tokens per sequence and step, root included)."""

    proposer: ProposerFn | Sequence[ProposerFn]
    max_budget: int = 16

    def __post_init__(self) -> None:
        check_budget(self.max_budget)
        if not callable(self.proposer) and not all(callable(p) for p in self.proposer):
            raise SpecRagError("a speculation proposer must be callable: proposer(tokens) -> continuations")

    def proposer_for(self, row: int) -> ProposerFn:
        if callable(self.proposer):
            return self.proposer
        if not 0 <= row < len(self.proposer):
            raise SpecRagError(f"no proposer for prompt {row}: {len(self.proposer)} proposers given")
        return self.proposer[row]


@dataclasses.dataclass
class SpeculationStats:
    """Decode-phase counts of one sequence: verifier steps, proposed tree nodes, accepted proposed tokens
    and emitted tokens (accepted + bonus; a plain step emits one)."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    histogram: dict[int, int] = dataclasses.field(default_factory=dict)  # tokens emitted in a step -> steps

    def record(self, proposed: int, accepted: int, emitted: int) -> None:
        """Count one verifier step."""
        self.steps += 1
        self.proposed += proposed
        self.accepted += accepted
        self.emitted += emitted
        self.histogram[emitted] = self.histogram.get(emitted, 0) + 1


class _Sequence(Protocol):
    prompt: list[int]
    out: list[int]
    pages: list[int]
    params: object
    finish: str | None


EmitFn = Callable[[int, int, float], None]  # (sequence index, token, logprob); sets the sequence's finish
PlainStepFn = Callable[[list[int]], None]  # one plain decode step for these sequence indices


def speculative_decode(
    runner,
    seqs: Sequence[_Sequence],
    max_new: int,
    spec: Speculation,
    width: int,
    emit: EmitFn,
    plain_step: PlainStepFn,
    stats: Sequence[SpeculationStats],
) -> None:
    """Decode every unfinished sequence to its end with speculation; ``width`` = the batch's sequence bucket."""
    vocab = runner.cfg.vocab_size
    while True:
        active = [i for i, s in enumerate(seqs) if s.finish is None]
        if not active:
            return
        proposals = {
            i: propose(spec.proposer_for(i), seqs[i].prompt + seqs[i].out, max_new - len(seqs[i].out) - 1, vocab)
            for i in active
        }
        largest = max(count_trie_nodes(p) for p in proposals.values())
        budget = _budget(runner, seqs, active, largest, spec.max_budget)
        if budget is None:
            plain_step(active)
            for i in active:
                stats[i].record(0, 0, 1)
            continue
        trees, chunks = [], []
        for i in active:
            s = seqs[i]
            kv_len = len(s.prompt) + len(s.out) - 1
            _grow_pages(runner, s, kv_len + budget)
            tree = build_tree(proposals[i], s.out[-1], budget, vocab_size=vocab)
            trees.append(tree)
            chunks.append(Chunk(s.pages, kv_len, tree.tokens, parents=tree.parents, positions=tree.positions(kv_len)))
        step = runner.pack(chunks, token_bucket=width * budget, min_seqs=width)
        sp = [seqs[i].params for i in active]
        _, num_accepted, tokens, logprobs, *_ = runner.speculate(
            step, stack_trees(trees), SamplingBatch.of(sp, [len(seqs[i].out) for i in active])
        )
        for row, i in enumerate(active):
            n, emitted = int(num_accepted[row]), 0
            for k in range(n + 1):
                if seqs[i].finish is not None:
                    break
                emit(i, int(tokens[row, k]), float(logprobs[row, k]))
                emitted += 1
            stats[i].record(trees[row].num_tokens - 1, n, emitted)


def propose(proposer: ProposerFn, tokens: Sequence[int], room: int, vocab: int) -> list[list[int]]:
    """The proposer's continuations of ``tokens``, each cut to ``room`` tokens (so that accepted tokens + the
    bonus fit the sequence's limit); a token outside the vocabulary is a one-line error."""
    if room <= 0:
        return []
    out = []
    for p in proposer(tokens):
        p = [int(t) for t in p[:room]]
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise SpecRagError(f"proposer returned token id {bad[0]} outside the vocabulary (size {vocab})")
        if p:
            out.append(p)
    return out


def _budget(runner, seqs, active: list[int], largest: int, max_budget: int) -> int | None:
    """The step's tree budget, or None for a plain decode step (nothing proposed, or no room in the context)."""
    if largest == 0:
        return None
    kv_end = max(len(seqs[i].prompt) + len(seqs[i].out) - 1 for i in active)
    room = largest_fitting_budget(kv_end, runner.max_seq_len, max_budget)
    return None if room is None else fit_budget(largest, room)


def _grow_pages(runner, s: _Sequence, slots: int) -> None:
    """Give ``s`` pages for ``slots`` logical K/V slots (the tree is written past the sequence's end)."""
    extra = pages_needed(slots, runner.page_size) - len(s.pages)
    if extra > 0:
        s.pages = s.pages + runner.allocator.allocate(extra)


def check_can_speculate(runner, spec: Speculation, name: str = "the model") -> None:
    """A one-line error when ``runner``'s model cannot verify token trees of ``spec``'s budget: its context
    must hold a prompt token, the smallest tree and a bonus token."""
    if runner.max_seq_len < TREE_BUDGETS[0] + 2:
        raise SpecRagError(
            f"{name} cannot speculate: its context of {runner.max_seq_len} tokens cannot hold a "
            f"token tree of {TREE_BUDGETS[0]} (use at least {TREE_BUDGETS[0] + 2})"
        )


def merge_stats(stats: Sequence[SpeculationStats]) -> SpeculationStats:
    """The sum of several sequences' counts."""
    total = SpeculationStats()
    for s in stats:
        total.steps, total.proposed = total.steps + s.steps, total.proposed + s.proposed
        total.accepted, total.emitted = total.accepted + s.accepted, total.emitted + s.emitted
        for k, v in s.histogram.items():
            total.histogram[int(k)] = total.histogram.get(int(k), 0) + int(v)
    return total


def combine_stats(stats: Sequence[SpeculationStats]) -> dict:
    """The eval JSON's ``speculation`` object over several sequences (public contract: ``steps``,
    ``accepted_tokens_per_step`` = tokens emitted per verifier step, accepted proposals + the bonus token, so
    plain decoding is 1.0; ``proposed_tokens_per_step`` = proposed tree nodes per step), plus the accepted
    proposed tokens alone and the histogram of tokens per step."""
    total = merge_stats(stats)
    per = lambda x: round(x / total.steps, 4) if total.steps else 0.0  # noqa: E731
    return {
        "steps": total.steps,
        "accepted_tokens_per_step": per(total.emitted),
        "proposed_tokens_per_step": per(total.proposed),
        "draft_tokens_accepted_per_step": per(total.accepted),
        "tokens_per_step_histogram": {str(k): v for k, v in sorted(total.histogram.items())},
    }


__all__ = [
    "Speculation",
    "SpeculationStats",
    "check_can_speculate",
    "combine_stats",
    "merge_stats",
    "propose",
    "speculative_decode",
]
