"""Combining the scores: rho = rho_draft * rho_SC * rho_SR (sums of logs), options and guardrails."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import normalize_answer

TERMS = ("draft", "sc", "sr")
UNPARSED_PENALTY = -1e4  # a draft that did not follow the format loses to every draft that did


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
    """normalize: "sum" = log of the product of token probabilities (the paper's printed formula);
    "mean" = per-token mean log-probability (length-normalised). terms: which factors enter rho.
    sr: "yes" = log P(Yes); "yes_vs_no" = log P(Yes) / (P(Yes) + P(No))."""

    normalize: str = "mean"
    terms: tuple[str, ...] = TERMS
    sr: str = "yes_vs_no"

    def __post_init__(self) -> None:
        if self.normalize not in ("sum", "mean"):
            raise SpecRagError(f"normalize must be 'sum' or 'mean' (got {self.normalize!r})")
        bad = [t for t in self.terms if t not in TERMS]
        if bad or not self.terms:
            raise SpecRagError(f"score terms must be a non-empty subset of {TERMS} (got {self.terms})")
        if self.sr not in ("yes", "yes_vs_no"):
            raise SpecRagError(f"sr must be 'yes' or 'yes_vs_no' (got {self.sr!r})")


def _norm(total: float, count: int, normalize: str) -> float:
    return total / max(count, 1) if normalize == "mean" else total


def sr_logprob(d: Draft, mode: str) -> float:
    if mode == "yes":
        return d.sr_logprob
    return d.sr_logprob - math.log(math.exp(d.sr_logprob) + math.exp(d.sr_no_logprob))


def score_drafts(drafts: Sequence[Draft], options: ScoreOptions) -> None:
    """Set ``draft.score`` = sum of the chosen log-terms (unparsed drafts get a large penalty)."""
    for d in drafts:
        parts = {
            "draft": _norm(d.draft_logprob, d.draft_tokens, options.normalize),
            "sc": _norm(d.sc_logprob, d.sc_tokens, options.normalize),
            "sr": sr_logprob(d, options.sr),
        }
        d.score = sum(parts[t] for t in options.terms) + (0.0 if d.parsed else UNPARSED_PENALTY)


def confidence(d: Draft) -> float:
    """A probability-like confidence in [0, 1] for the tau_min guardrail: the geometric mean token
    probability of draft and rationale/answer, times P(Yes | Yes or No)."""
    mean_lp = (_norm(d.draft_logprob, d.draft_tokens, "mean") + _norm(d.sc_logprob, d.sc_tokens, "mean")) / 2
    return math.exp(mean_lp + sr_logprob(d, "yes_vs_no")) if d.parsed else 0.0


def consensus(drafts: Sequence[Draft]) -> bool:
    """True when at least two drafts parsed and all parsed drafts give the same (normalised) answer."""
    answers = {normalize_answer(d.answer) for d in drafts if d.parsed}
    return len([d for d in drafts if d.parsed]) >= 2 and len(answers) == 1 and "" not in answers


def best(drafts: Sequence[Draft], key: str = "score") -> Draft:
    """The draft with the highest ``key`` (ties: the lowest index)."""
    return max(drafts, key=lambda d: (getattr(d, key) + (0.0 if d.parsed else UNPARSED_PENALTY), -d.index))
