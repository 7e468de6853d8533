"""Choosing a draft: rho = rho_draft * rho_SC * rho_SR (sums of logs), evidence-aware scores, answer-level
aggregation, and the confidence the cascade thresholds.

Selection options (``RAGConfig.selection``, ``--selection``):
- ``rho``: the paper's score, from a verifier that reads only the question and the draft (``--terms``);
- ``evidence``: the verifier reads each draft's own passages (``verification.py``, evidence-aware) and scores the
  draft's tokens and "Yes" to "is the response supported by the evidence" (``EVIDENCE_TERMS``);
- ``+agg`` (``rho+agg``, ``evidence+agg``): drafts whose normalised answers agree pool their probabilities
  (log-sum-exp of their scores, Self-RAG's rule for closed-set tasks); the best-scoring answer wins and its
  best-scoring draft is returned;
- ``+ground`` (after ``+agg`` when both): only drafts whose answer occurs in their own passages
  (``Draft.grounded``) compete when any does, and the cascade never accepts an ungrounded draft (confidence 0, so
  at any tau_min above 0; tau_min 0 accepts every pick).
  Held-out drafts whose answer their passages lack were right 0 of 60 times
  (``benchmarks/results/draft_grounding.json``). Drafts not checked (closed-set labels) count as grounded.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from typing import Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import normalize_answer

TERMS = ("draft", "sc", "sr", "ev_sc", "ev_sr")
PLAIN_TERMS = ("draft", "sc", "sr")  # the paper's rho (no documents)
# evidence-aware selection's score: P(Yes | evidence, draft) alone (train split: 32.9%; with ev_sc, the draft's tokens
# given its passages, 20.0%: benchmarks/results/cascade_choice_train.json)
EVIDENCE_TERMS = ("ev_sr",)
SELECTIONS = (
    "rho",
    "evidence",
    "rho+agg",
    "evidence+agg",
    "rho+ground",
    "evidence+ground",
    "rho+agg+ground",
    "evidence+agg+ground",
)
UNPARSED_PENALTY = -1e4  # a draft that did not follow the format loses to every draft that did


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
    """normalize: "sum" = log of the product of token probabilities (the paper's printed formula);
    "mean" = per-token mean log-probability (length-normalised). terms: which factors enter rho.
    sr: "yes" = log P(Yes); "yes_vs_no" = log P(Yes) / (P(Yes) + P(No))."""

    normalize: str = "mean"
    terms: tuple[str, ...] = PLAIN_TERMS
    sr: str = "yes_vs_no"

    def __post_init__(self) -> None:
        if self.normalize not in ("sum", "mean"):
            raise SpecRagError(f"normalize must be 'sum' or 'mean' (got {self.normalize!r})")
        bad = [t for t in self.terms if t not in TERMS]
        if bad or not self.terms:
            raise SpecRagError(
                f"score terms must be a non-empty subset of {', '.join(TERMS)} (got {','.join(self.terms) or 'none'})"
            )
        if self.sr not in ("yes", "yes_vs_no"):
            raise SpecRagError(f"sr must be 'yes' or 'yes_vs_no' (got {self.sr!r})")


def check_selection(selection: str) -> str:
    """``selection`` if it is one of SELECTIONS, else a one-line error."""
    if selection not in SELECTIONS:
        raise SpecRagError(f"unknown selection {selection!r}; choose one of {', '.join(SELECTIONS)}")
    return selection


def with_agg(selection: str) -> str:
    """``selection`` with answer-level aggregation (closed-set questions always pool their labels' scores)."""
    if "+agg" in check_selection(selection):
        return selection
    base, _, rest = selection.partition("+")
    return check_selection(f"{base}+agg" + (f"+{rest}" if rest else ""))


def selection_for(selection: str, closed: bool) -> str:
    """The selection the pipeline runs for ``selection``: closed-set questions always aggregate their labels."""
    return with_agg(selection) if closed else selection


def grounds(selection: str) -> bool:
    """Whether ``selection`` picks and accepts only grounded drafts (``+ground``)."""
    return selection.endswith("+ground")


def eligible(d: Draft) -> bool:
    """A draft ``+ground`` selections may pick: parsed, and its answer occurs in its passages (or was not checked)."""
    return d.parsed and d.grounded is not False


def candidates(drafts: Sequence[Draft], selection: str) -> list[Draft]:
    """The drafts ``selection`` may pick: the eligible ones under ``+ground`` when there are any, else all."""
    pool = [d for d in drafts if eligible(d)] if grounds(selection) else []
    return pool or list(drafts)


def selection_scores(selection: str, scores: ScoreOptions) -> ScoreOptions:
    """The score options a selection ranks drafts by (``rho``: ``scores`` as configured; ``evidence``: the
    evidence terms with the same normalisation)."""
    if check_selection(selection).startswith("evidence"):
        return ScoreOptions(scores.normalize, EVIDENCE_TERMS, scores.sr)
    return scores


def needs_verification(options: ScoreOptions) -> tuple[bool, bool]:
    """(the plain verification tree, the evidence-aware tree): which passes ``options``' terms need."""
    return any(t in ("sc", "sr") for t in options.terms), any(t.startswith("ev_") for t in options.terms)


def _norm(total: float, count: int, normalize: str) -> float:
    return total / max(count, 1) if normalize == "mean" else total


def _yes(yes: float, no: float, mode: str) -> float:
    return yes if mode == "yes" else yes - math.log(math.exp(yes) + math.exp(no))


def sr_logprob(d: Draft, mode: str) -> float:
    """log P(Yes) (or Yes vs No) of the plain reflection."""
    return _yes(d.sr_logprob, d.sr_no_logprob, mode)


def ev_sr_logprob(d: Draft, mode: str) -> float:
    """log P(Yes) (or Yes vs No) of the evidence-aware reflection."""
    return _yes(d.ev_sr_logprob, d.ev_sr_no_logprob, mode)


# Each term's value for a draft; only the chosen terms are computed (the others' passes may not have run).
_TERM_VALUES = {
    "draft": lambda d, options: _norm(d.draft_logprob, d.draft_tokens, options.normalize),
    "sc": lambda d, options: _norm(d.sc_logprob, d.sc_tokens, options.normalize),
    "sr": lambda d, options: sr_logprob(d, options.sr),
    "ev_sc": lambda d, options: _norm(d.ev_sc_logprob, d.ev_sc_tokens, options.normalize),
    "ev_sr": lambda d, options: ev_sr_logprob(d, options.sr),
}


def score_drafts(drafts: Sequence[Draft], options: ScoreOptions) -> None:
    """Set ``draft.score`` = sum of the chosen log-terms (unparsed drafts get a large penalty)."""
    for d in drafts:
        d.score = sum(_TERM_VALUES[t](d, options) for t in options.terms) + (0.0 if d.parsed else UNPARSED_PENALTY)


def answer_key(answer: str) -> str:
    """The key agreeing answers share: ``normalize_answer``, or for an answer that is only an article (the label
    "A" of a closed set) the lower-cased word itself; "" for an empty answer."""
    return normalize_answer(answer) or " ".join(re.sub(r"[^\w\s]", " ", answer.lower()).split())


def answer_groups(drafts: Sequence[Draft]) -> dict[str, list[Draft]]:
    """Parsed drafts grouped by ``answer_key`` (unparsed or empty answers are left out)."""
    groups: dict[str, list[Draft]] = defaultdict(list)
    for d in drafts:
        key = answer_key(d.answer)
        if d.parsed and key:
            groups[key].append(d)
    return dict(groups)


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def best(drafts: Sequence[Draft], key: str = "score") -> Draft:
    """The draft with the highest ``key`` (ties: the lowest index)."""
    return max(drafts, key=lambda d: (getattr(d, key) + (0.0 if d.parsed else UNPARSED_PENALTY), -d.index))


def best_answer(drafts: Sequence[Draft]) -> Draft:
    """Answer-level aggregation: the best draft of the answer whose drafts' pooled score (log-sum-exp) is highest
    (ties: the answer of the lowest-index draft); ``best`` when no draft parsed."""
    groups = answer_groups(drafts)
    if not groups:
        return best(drafts)
    pooled = {key: _logsumexp([d.score for d in group]) for key, group in groups.items()}
    key = max(pooled, key=lambda k: (pooled[k], -min(d.index for d in groups[k])))
    return best(groups[key])


def select(drafts: Sequence[Draft], selection: str, scores: ScoreOptions) -> Draft:
    """Score ``drafts`` for ``selection`` (its verification must have run) and return the chosen draft
    (``+ground``: among the eligible drafts when there are any)."""
    score_drafts(drafts, selection_scores(selection, scores))
    pool = candidates(drafts, selection)
    return best_answer(pool) if "+agg" in selection else best(pool)


def confidence(d: Draft) -> float:
    """The paper-style confidence in [0, 1] (``rho`` selection): the geometric mean token probability of draft
    and rationale/answer, times P(Yes | Yes or No)."""
    mean_lp = (_norm(d.draft_logprob, d.draft_tokens, "mean") + _norm(d.sc_logprob, d.sc_tokens, "mean")) / 2
    return math.exp(mean_lp + sr_logprob(d, "yes_vs_no")) if d.parsed else 0.0


def support(chosen: Draft, drafts: Sequence[Draft]) -> float:
    """The cascade's confidence in [0, 1] for evidence-aware selections: the share of all drafts that give the
    chosen (normalised) answer, each weighted by the verifier's P(Yes | Yes or No) that its evidence supports it."""
    if not chosen.parsed or not drafts:
        return 0.0
    key = answer_key(chosen.answer)
    agreeing = answer_groups(drafts).get(key, [chosen])
    return sum(math.exp(ev_sr_logprob(d, "yes_vs_no")) for d in agreeing) / len(drafts)


def support_bound(drafts: Sequence[Draft], grounded: bool = False) -> float:
    """The most ``support`` can be for any of ``drafts`` whatever the verifier says (each P(Yes) is at most 1):
    the share of drafts in the largest group that agrees on a parsed answer (1 / m for a lone parsed draft; 0.0
    when none parsed). ``grounded``: only groups with an eligible draft count (0.0 when no draft is eligible)."""
    if not any(eligible(d) if grounded else d.parsed for d in drafts):
        return 0.0
    groups = [g for g in answer_groups(drafts).values() if not grounded or any(eligible(d) for d in g)]
    largest = max((len(g) for g in groups), default=1)
    return max(largest, 1) / len(drafts)


def certain_fallback(drafts: Sequence[Draft], selection: str, tau_min: float | None) -> float | None:
    """The most the cascade's confidence can be when it must fall back before any verification (an
    evidence-aware selection whose ``support`` cannot reach ``tau_min``; a ``+ground`` selection with no eligible
    draft: 0.0), else None. The margin keeps a bound that equals tau_min up to rounding of the P(Yes) sum on the
    verifying side."""
    if tau_min is None:
        return None
    if grounds(selection) and not any(eligible(d) for d in drafts):
        bound = 0.0
    elif selection.startswith("evidence"):
        bound = support_bound(drafts, grounds(selection))
    else:
        return None
    return bound if bound < tau_min - 1e-9 else None


def selection_confidence(chosen: Draft, drafts: Sequence[Draft], selection: str) -> float:
    """The confidence the cascade compares with tau_min: ``support`` for evidence-aware selections, else the
    paper-style ``confidence``; 0.0 for an ineligible draft under ``+ground``."""
    if grounds(selection) and not eligible(chosen):
        return 0.0
    return support(chosen, drafts) if selection.startswith("evidence") else confidence(chosen)


def consensus(drafts: Sequence[Draft], grounded: bool = False) -> bool:
    """True when at least two drafts parsed and all parsed drafts give the same answer (``answer_key``);
    ``grounded``: and one of them is eligible (``+ground`` never accepts an answer no passage holds)."""
    answers = {answer_key(d.answer) for d in drafts if d.parsed}
    agree = len([d for d in drafts if d.parsed]) >= 2 and len(answers) == 1 and "" not in answers
    return agree and (not grounded or any(eligible(d) for d in drafts))
