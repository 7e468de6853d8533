"""How a request speculates (``Speculation``: its proposers and largest tree budget), what it counted
(``SpeculationStats``, the eval JSON's ``speculation`` object) and the proposal rule.

The engine's speculation steps (``models/engine/spec_steps.py``) run it: every decoding sequence's proposer
proposes continuations; they merge into one trie per sequence (``tree.build_tree``); all trees go through ONE
verifier pass (``ModelRunner.speculate``: acceptance and K/V compaction on device); each sequence emits its
accepted tokens plus the bonus token. Greedy output equals plain greedy decoding (up to numerical near-ties: a
tree pass and a one-token pass round differently); sampled output has the verifier's own distribution.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.speculative.tree import TREE_BUDGETS, check_budget, default_tree_budget

ProposerFn = Callable[[Sequence[int]], list[list[int]]]


@dataclasses.dataclass(frozen=True)
class Speculation:
    """How a ``Generator`` speculates: one proposer for every sequence, or one per prompt (in order), and the
    largest tree budget (chunk tokens per sequence and step, root included; default: the platform's,
    ``tree.default_tree_budget``: 8 on CPU, 16 on a GPU or TPU)."""

    proposer: ProposerFn | Sequence[ProposerFn]
    max_budget: int = dataclasses.field(default_factory=default_tree_budget)

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
]
