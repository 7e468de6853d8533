"""The router (method ``auto``): per question, before drafting, exact standard RAG or the speculative cascade.

Two paths give an answer at least as good as standard RAG's on average:

- ``exact``: standard RAG's answer decoded through lossless mode with n-gram proposals (``lossless.py``): the
  verifier's own tokens, fewer verifier steps, no drafter work;
- ``cascade``: drafts, verification, and the accepted draft or (below tau_min) the same exact answer as fallback.

Each path's latency is predicted from the roofline's cost model (``roofline.generation_cost`` /
``drafting_cost``, ``executor.cost.tree_cost``) at the running platform's peaks (``machine_peaks.platform_peaks``:
measured on a CPU, published for a GPU or TPU) times each stage's measured ratio to its bound, with the token counts
of this question's prompts and the train split's averages for what is not known yet (answer and draft lengths,
tokens per speculative step). The cascade's expected latency is drafting + verification (at the rate it runs) +
(1 - P(accept)) x the fallback; its expected change of accuracy is P(accept, right) - P(accept, standard right)
(``route_predictor``). The router takes the cascade only when that change is at least ``-max_loss`` and its expected
latency is below the exact path's by at least ``margin``; otherwise the exact path. Everything it used is returned
(``Route.to_dict``: the trace's ``route`` entry), so a GPU or TPU decides with its own peaks and no code change.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import Mapping, Sequence

import jax

from specrag_jax.errors import SpecRagError
from specrag_jax.machine_peaks import MachinePeaks, platform_peaks
from specrag_jax.models.executor.cost import ModelCost, tree_cost
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.closed_set import ClosedSet
from specrag_jax.pipeline.drafting import draft_prompts
from specrag_jax.pipeline.prompts import verifier_prefix
from specrag_jax.pipeline.roofline import drafting_cost, generation_cost, model_cost
from specrag_jax.pipeline.route_predictor import AcceptancePredictor, route_features
from specrag_jax.pipeline.verifier_prompts import answer_prompt

ROUTE_PATHS = ("exact", "cascade")
EXACT_PROPOSER = "ngram"  # the exact path's proposals: no drafts exist before drafting
CALIBRATION_FILE = Path(__file__).with_name("router_calibration.json")
STAGES = ("exact", "drafting", "verification", "fallback")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What is not known before drafting, as averaged over the train split's answers (the calibration file)."""

    answer_tokens: float  # the verifier's answer, one line (the paper's short answers: eval)
    exact_tokens_per_step: float  # lossless mode with n-gram proposals: tokens emitted per verifier step
    exact_proposed_per_step: float
    fallback_tokens_per_step: float  # the cascade's fallback (drafts and n-grams as proposals)
    fallback_proposed_per_step: float
    draft_tokens: float  # tokens a draft writes (rationale, answer and their tags)
    draft_steps: float  # drafter decode steps (the longest draft of a question)
    verify_tokens_per_draft: float  # verification tree tokens per draft (draft, reflection and answer rows)
    verify_rate: float  # share of the cascade's questions that run verification (the rest fall back early)
    turn_answer_tokens: float  # the verifier's answer to its end of turn (ask, /v1/rag, the API)

    def for_answers(self, answer_stop: str) -> "Workload":
        """This workload with the answer length of the answer form (``RAGConfig.answer_stop``)."""
        return dataclasses.replace(self, answer_tokens=self.turn_answer_tokens) if answer_stop == "turn" else self


@dataclasses.dataclass(frozen=True)
class RouterCalibration:
    predictor: AcceptancePredictor
    workload: Workload
    stage_ratio: Mapping[str, Mapping[str, float]]  # platform (or "default") -> stage -> measured / bound
    source: Mapping

    def ratios(self, platform: str) -> Mapping[str, float]:
        """Each stage's measured / bound on ``platform`` ("default" where it was never measured)."""
        return self.stage_ratio.get(platform) or self.stage_ratio["default"]

    def to_dict(self) -> dict:
        return {
            "source": dict(self.source),
            "predictor": self.predictor.to_dict(),
            "workload": dataclasses.asdict(self.workload),
            "stage_ratio": {k: dict(v) for k, v in self.stage_ratio.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "RouterCalibration":
        """Checked: every stage's ratio on every platform positive and finite, every workload figure too (the
        predictor checks its own vectors)."""
        ratios = {k: {s: float(r) for s, r in v.items()} for k, v in d["stage_ratio"].items()}
        for platform, table in ratios.items():
            missing = [s for s in STAGES if s not in table]
            if missing:
                raise SpecRagError(f"router calibration: stage_ratio[{platform!r}] lacks {missing[0]!r}")
            if not all(math.isfinite(r) and r > 0 for r in table.values()):
                raise SpecRagError(f"router calibration: stage_ratio[{platform!r}] must be positive numbers")
        if "default" not in ratios:
            raise SpecRagError("router calibration: stage_ratio needs a 'default' platform")
        workload = Workload(**{k: float(v) for k, v in d["workload"].items()})
        if not all(math.isfinite(v) and v > 0 for v in dataclasses.astuple(workload)):
            raise SpecRagError("router calibration: every workload figure must be a positive number")
        return cls(AcceptancePredictor.from_dict(d["predictor"]), workload, ratios, d["source"])


@functools.lru_cache(maxsize=4)
def load_calibration(path: str | None = None) -> RouterCalibration:
    """The router's calibration (default: the shipped ``router_calibration.json``; a one-line error if unreadable)."""
    file = Path(path) if path else CALIBRATION_FILE
    try:
        return RouterCalibration.from_dict(json.loads(file.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecRagError(f"cannot read the router calibration {file}: {type(e).__name__}: {e}") from None


def check_router(max_loss: float, margin: float) -> None:
    """One-line errors for out-of-range router options."""
    if not (isinstance(max_loss, (int, float)) and 0.0 <= max_loss <= 1.0):
        raise SpecRagError(f"router max_loss must be in [0, 1] (got {max_loss!r})")
    if not (isinstance(margin, (int, float)) and 0.0 <= margin < 1.0):
        raise SpecRagError(f"router margin must be in [0, 1) (got {margin!r})")


@dataclasses.dataclass(frozen=True)
class PromptCounts:
    """Token counts of this question's prompts, known before drafting."""

    prompt: int  # the verifier's standard-RAG prompt (the exact path and the fallback prefill it)
    drafter_prefix: int  # drafting's shared prefix (instruction and question)
    drafter_evidence: float  # one draft's evidence branch (its k passages), on average
    verifier_prefix: int  # verification's shared prefix
    drafts: int  # m


def predict_stages(
    counts: PromptCounts,
    drafter: ModelCost,
    verifier: ModelCost,
    peaks: MachinePeaks,
    ratios: Mapping[str, float],
    workload: Workload,
) -> dict[str, float]:
    """Predicted seconds of each stage (``STAGES``): its bound at ``peaks`` times its measured ratio."""
    w, m = workload, counts.drafts
    rate = (peaks.flops_per_s, peaks.bytes_per_s)

    def answer(tokens_per_step: float, proposed_per_step: float):
        steps = max(math.ceil(max(w.answer_tokens - 1, 0.0) / max(tokens_per_step, 1.0)), 1)
        prefill, decode = generation_cost(verifier, counts.prompt, w.answer_tokens, steps, proposed_per_step * steps)
        return prefill + decode

    bounds = {
        "exact": answer(w.exact_tokens_per_step, w.exact_proposed_per_step).bound_s(*rate),
        "drafting": drafting_cost(
            drafter, counts.drafter_prefix, counts.drafter_evidence * m, m, round(w.draft_steps), w.draft_tokens
        ).bound_s(*rate),
        "verification": tree_cost(
            verifier,
            counts.verifier_prefix,
            counts.verifier_prefix + round(w.verify_tokens_per_draft * m),
            m,
            round((w.draft_tokens + 1) * m),  # scored rows: each draft's tokens and its Yes/No row
        ).bound_s(*rate),
        "fallback": answer(w.fallback_tokens_per_step, w.fallback_proposed_per_step).bound_s(*rate),
    }
    return {s: bounds[s] * float(ratios[s]) for s in STAGES}


@dataclasses.dataclass(frozen=True)
class Route:
    """The router's decision for one question and everything it was made from."""

    path: str  # "exact" or "cascade"
    predicted_s: Mapping[str, float]  # each path's expected seconds
    stages_s: Mapping[str, float]  # each stage's predicted seconds
    acceptance: Mapping[str, float]  # route_predictor.TARGETS' probabilities
    accuracy_change: float  # the cascade's expected accuracy minus standard RAG's
    break_even_accept: float  # P(accept) from which the cascade would be the faster path (> 1: never)
    platform: str
    peaks: Mapping
    reason: str
    decide_s: float = 0.0  # the decision's own time (counts, features, predictions)
    counts: PromptCounts | None = None  # the prompt sizes it predicted from

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "predicted_s": {k: _sig(v) for k, v in self.predicted_s.items()},
            "stages_s": {k: _sig(v) for k, v in self.stages_s.items()},
            "acceptance": {k: _sig(v) for k, v in self.acceptance.items()},
            "accuracy_change": _sig(self.accuracy_change),
            "break_even_accept": _sig(self.break_even_accept),
            "platform": self.platform,
            "peaks": dict(self.peaks),
            "reason": self.reason,
            "decide_s": _sig(self.decide_s),
            **({"counts": dataclasses.asdict(self.counts)} if self.counts is not None else {}),
        }


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def choose(
    stages: Mapping[str, float],
    acceptance: Mapping[str, float],
    verify_rate: float,
    *,
    max_loss: float = 0.0,
    margin: float = 0.0,
    platform: str = "cpu",
    peaks: Mapping | None = None,
) -> Route:
    """The path with the least expected latency at no expected loss of accuracy beyond ``max_loss`` (ties and
    near-ties within ``margin`` go to the exact path: it needs no drafter and its answer is standard RAG's)."""
    check_router(max_loss, margin)
    p_accept = acceptance["accept"]
    drafts_cost = stages["drafting"] + verify_rate * stages["verification"]
    cascade = drafts_cost + (1.0 - p_accept) * stages["fallback"]
    predicted = {"exact": stages["exact"], "cascade": cascade}
    # the acceptance rate from which the cascade is the faster path (above 1: never)
    break_even = (drafts_cost + stages["fallback"] - (1.0 - margin) * stages["exact"]) / stages["fallback"]
    change = acceptance["accept_right"] - acceptance["accept_standard_right"]
    faster = cascade < (1.0 - margin) * stages["exact"]
    if faster and change >= -max_loss:
        path, why = (
            "cascade",
            f"expected {cascade:.3g} s < exact {stages['exact']:.3g} s, accuracy change {change:+.3f}",
        )
    elif faster:
        path, why = "exact", f"the cascade is faster but would change accuracy by {change:+.3f} (floor -{max_loss})"
    elif cascade < stages["exact"]:
        path = "exact"
        why = f"expected cascade {cascade:.3g} s is within the margin {margin} of exact {stages['exact']:.3g} s"
    else:
        path = "exact"
        why = f"expected cascade {cascade:.3g} s >= exact {stages['exact']:.3g} s at P(accept) {p_accept:.2f}"
        never = " (drafting and verification alone cost more)"
        why += f" (it pays above P(accept) {break_even:.2f})" if break_even <= 1 else never
    return Route(path, predicted, dict(stages), dict(acceptance), change, break_even, platform, dict(peaks or {}), why)


def platform_name() -> str:
    """The running JAX backend: "cpu", "gpu" or "tpu" (the calibration's ``stage_ratio`` key)."""
    return jax.default_backend()


def prompt_counts(
    drafter: TextModel,
    verifier: TextModel,
    question: str,
    docs: Sequence[dict],
    *,
    m: int,
    k: int,
    chat: bool,
    closed: ClosedSet | None = None,
) -> PromptCounts:
    """This question's prompt sizes: the verifier's standard prompt (exact), drafting's prefix and one draft's
    evidence (k of the passages, at their mean length), verification's prefix."""
    prompt = verifier.tokenizer.encode_rendered(answer_prompt(verifier.tokenizer, question, list(docs), chat, closed))
    prefix, [evidence] = draft_prompts(drafter, question, [list(docs)], closed)
    share = min(k, len(docs)) / max(len(docs), 1)
    v_prefix = verifier.tokenizer.encode(verifier_prefix(question, closed), add_bos=False)
    return PromptCounts(len(prompt), len(prefix), len(evidence) * share, len(v_prefix), m)


def route_counts(
    counts: PromptCounts,
    acceptance: Mapping[str, float],
    drafter: ModelCost,
    verifier: ModelCost,
    peaks: MachinePeaks,
    platform: str,
    calibration: RouterCalibration | None = None,
    *,
    max_loss: float = 0.0,
    margin: float = 0.0,
    answer_stop: str = "line",
) -> Route:
    """The decision for these prompt sizes and acceptance on a platform of these peaks (no model pass: a trace's
    ``route`` re-decided for another platform is ``route_counts(PromptCounts(**r["counts"]), r["acceptance"], ...)``,
    ``route_on``); ``answer_stop``: the answer form whose average length the answer stages decode."""
    calibration = calibration or load_calibration()
    workload = calibration.workload.for_answers(answer_stop)
    stages = predict_stages(counts, drafter, verifier, peaks, calibration.ratios(platform), workload)
    verify_rate = calibration.workload.verify_rate
    found = choose(
        stages, acceptance, verify_rate, max_loss=max_loss, margin=margin, platform=platform, peaks=peaks.to_dict()
    )
    return dataclasses.replace(found, counts=counts)


def decide(
    drafter: TextModel,
    verifier: TextModel,
    question: str,
    docs: Sequence[dict],
    *,
    m: int,
    k: int,
    chat: bool,
    closed: ClosedSet | None = None,
    max_loss: float = 0.0,
    margin: float = 0.0,
    answer_stop: str = "line",
    peaks: MachinePeaks | None = None,
    platform: str | None = None,
    calibration: RouterCalibration | None = None,
) -> Route:
    """Route one question (``choose`` over ``predict_stages`` and the acceptance predictor); ``peaks`` and
    ``platform`` default to the running platform's (a GPU's or TPU's published peaks decide there)."""
    t = time.perf_counter()
    calibration = calibration or load_calibration()
    counts = prompt_counts(drafter, verifier, question, docs, m=m, k=k, chat=chat, closed=closed)
    acceptance = calibration.predictor.predict(route_features(question, docs))
    costs = (model_cost(drafter), model_cost(verifier))
    peaks, platform = peaks or platform_peaks(), platform or platform_name()
    route = route_counts(
        counts,
        acceptance,
        *costs,
        peaks,
        platform,
        calibration,
        max_loss=max_loss,
        margin=margin,
        answer_stop=answer_stop,
    )
    return dataclasses.replace(route, decide_s=time.perf_counter() - t)


def route_on(
    route: Mapping, drafter: ModelCost, verifier: ModelCost, peaks: MachinePeaks, platform: str, **options
) -> Route:
    """The decision the same question (a trace's ``route`` with its ``counts``) would get on another platform:
    the same prompt sizes and acceptance, that platform's peaks and stage ratios (a prediction, no model pass)."""
    counts = PromptCounts(**route["counts"])
    return route_counts(counts, route["acceptance"], drafter, verifier, peaks, platform, **options)
