"""Per-stage roofline of one answer: measured time against the time its FLOPs and bytes need at this machine's
peaks (public contract: ``roofline: {STAGE: {"measured_s", "bound_s", "ratio"}}`` in ``ask --json`` traces and
the eval JSON).

Stages and the trace counts they read (``models/executor/cost.py`` turns counts into FLOPs and bytes):
- ``clustering``: the drafter's question-conditioned embedding pass (a tree per step: question + documents; with
  ``--clustering drafter`` only: lexical clustering runs no model and has no row);
- ``drafting``: the drafter's prefill of every subset prompt and the drafts' batched decode steps;
- ``verification`` / ``evidence_verification``: one packed tree pass of the verifier (drafts; drafts with
  their passages);
- ``standard``, ``lossless``, ``fallback`` (the cascade's standard answer), ``exact`` (the router's exact path):
  the verifier's chunked prefill
  (``<name>.prefill``) and its decode steps (``<name>.decode``: plain, or token trees when speculating).

A stage's bound sums its serial parts' bounds (``Cost.bound_s``): drafting's prefill at the matmul peak, then its
decode steps at the memory bandwidth; a single pass (verification) is the larger of its two times.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

import jax

from specrag_jax.machine_peaks import DEVICE_PEAKS, MachinePeaks, device_peaks, peaks_once
from specrag_jax.models.deferred_model import DeferredTextModel
from specrag_jax.models.executor.cost import Cost, ModelCost, causal_pairs, decode_cost, prefill_cost, tree_cost
from specrag_jax.models.generation import DEFAULT_MAX_PREFILL_TOKENS

PREFILL_CHUNK = DEFAULT_MAX_PREFILL_TOKENS  # tokens per prefill step


@dataclasses.dataclass(frozen=True)
class StageRoofline:
    measured_s: float  # the stage's time without its own one-time XLA work (``compile_s``)
    cost: Cost
    peaks: MachinePeaks
    compile_s: float = 0.0

    def to_dict(self) -> dict:
        compute = self.cost.flops / self.peaks.flops_per_s
        memory = self.cost.bytes / self.peaks.bytes_per_s
        bound = self._bound_on(self.peaks)  # its serial parts, summed
        return {
            "measured_s": _sig(self.measured_s),
            "bound_s": _sig(bound),
            "ratio": _sig(self.measured_s / bound) if bound > 0 else None,
            "gflop": _sig(self.cost.flops / 1e9),
            "gbytes": _sig(self.cost.bytes / 1e9),
            "compute_s": _sig(compute),
            "memory_s": _sig(memory),
            "steps": self.cost.steps,
            "compile_s": _sig(self.compile_s),
            # the same work's bound on each accelerator of DEVICE_PEAKS, part by part (a prediction)
            "device_bound_s": {name: _sig(self._bound_on(device_peaks(name))) for name in DEVICE_PEAKS},
        }

    def _bound_on(self, peaks: MachinePeaks) -> float:
        return self.cost.bound_s(peaks.flops_per_s, peaks.bytes_per_s)


def _sig(x: float, digits: int = 5) -> float:
    return float(f"{x:.{digits}g}")


def generation_cost(
    verifier: ModelCost, prompt: int, new: float, steps: int = 0, proposed: float = 0.0
) -> tuple[Cost, Cost]:
    """(prefill, decode) costs of a verifier answer of ``new`` tokens after ``prompt``: plain decode, or ``steps``
    token-tree steps that proposed ``proposed`` tokens in all (speculation)."""
    prefill = prefill_cost(verifier, prompt, PREFILL_CHUNK)
    if steps:
        per_step = 1 + proposed / steps  # the last token plus the proposed tree
        tree_step = verifier.step(round(per_step), per_step * (prompt + new / 2), context=prompt + new / 2)
        return prefill, tree_step.times(steps)
    return prefill, decode_cost(verifier, max(round(new) - 1, 0), 1, prompt + new / 2)


def _generation(trace: Mapping, verifier: ModelCost) -> tuple[Cost, Cost]:
    """(prefill, decode) costs of the verifier's answer in ``trace``."""
    counts = (trace.get("speculation") or {}).get("counts") or {}
    return generation_cost(
        verifier,
        int(trace.get("verifier_prefill_tokens", 0)),
        int(trace.get("verifier_decode_tokens", 0)),
        int(counts.get("steps", 0) or 0),
        float(counts.get("proposed", 0)),
    )


def drafting_cost(drafter: ModelCost, shared: int, prompt: float, drafts: int, steps: int, new: float) -> Cost:
    """The drafter's prefill of ``drafts`` branches (``prompt`` tokens in all) after their ``shared`` prefix, then
    ``steps`` batched decode steps writing ``new`` tokens a draft on average."""
    per_draft = prompt / drafts
    pairs = causal_pairs(shared) + drafts * causal_pairs(round(per_draft), shared)
    pre = drafter.step(shared + round(prompt), pairs, logits_rows=drafts)
    return pre + decode_cost(drafter, steps, drafts, shared + per_draft + new / 2)


def stage_costs(trace: Mapping, drafter: ModelCost, verifier: ModelCost, method: str) -> dict[str, tuple[float, Cost]]:
    """``{stage: (measured seconds, Cost)}`` for every stage the trace ran and counted."""
    out: dict[str, tuple[float, Cost]] = {}
    drafts = int(trace.get("num_subsets", 0)) or 1
    if "clustering_tokens" in trace and trace.get("clustering_s") is not None:
        q = int(trace.get("clustering_question_tokens", 0))
        tokens = int(trace["clustering_tokens"])
        steps = max(int(trace.get("clustering_steps", 1)), 1)
        docs = max(int(trace.get("clustering_docs", 1)), 1)
        doc_tokens = max(tokens - q * steps, 0)  # every step repeats the question as the trunk of its tree
        pairs = steps * causal_pairs(q) + doc_tokens * (q + (doc_tokens / docs + 1) / 2)
        one = drafter.step(tokens, pairs, logits_rows=0)  # pooled hidden states: no head
        out["clustering"] = (float(trace["clustering_s"]), Cost(one.flops, drafter.weight_bytes * steps, steps))
    if "drafter_prefill_tokens" in trace:
        shared = int(trace.get("drafter_shared_prefix_tokens", 0))
        prompt = int(trace["drafter_prefill_tokens"]) - shared
        steps = int(trace.get("drafter_decode_steps", 0))
        new = int(trace.get("drafter_decode_tokens", 0)) / drafts
        out["drafting"] = (
            float(trace.get("drafting_s", 0.0)),
            drafting_cost(drafter, shared, prompt, drafts, steps, new),
        )
    for name, key in (("verification", "verifier"), ("evidence_verification", "evidence")):
        if f"{key}_tree_tokens" in trace and trace.get(f"{name}_s") is not None:
            rows = trace.get(f"{key}_scored_rows")
            prefix, tree = int(trace[f"{key}_prefix_tokens"]), int(trace[f"{key}_tree_tokens"])  # tree: branches only
            cached = int(trace.get(f"{key}_prefix_cached_tokens", 0))
            cost = tree_cost(verifier, prefix, prefix + tree, drafts, None if rows is None else int(rows), cached)
            out[name] = (float(trace[f"{name}_s"]), cost)
    if "verifier_prefill_tokens" in trace and trace.get("generation_s") is not None:
        name = generation_stage(method, trace.get("path"))
        prefill, decode = _generation(trace, verifier)
        total = float(trace["generation_s"])
        out[name] = (total, prefill + decode)
        if trace.get("verifier_decode_s") is not None:
            out[f"{name}.decode"] = (float(trace["verifier_decode_s"]), decode)
            out[f"{name}.prefill"] = (total - float(trace["verifier_decode_s"]), prefill)
    return out


def stage_compile_s(trace: Mapping, stage: str, method: str) -> float:
    """A stage's own one-time XLA seconds in the trace: ``<stage>_compile_s`` (drafting, verification, evidence
    verification); for the verifier's answer (``generation_stage``) its phases' ``verifier_prefill_compile_s`` and
    ``verifier_decode_compile_s``, both for the whole stage."""
    if f"{stage}_compile_s" in trace:
        return float(trace[f"{stage}_compile_s"] or 0.0)
    name, _, phase = stage.partition(".")
    if name != generation_stage(method, trace.get("path")):
        return 0.0
    phases = ("prefill", "decode") if not phase else (phase,)
    return sum(float(trace.get(f"verifier_{p}_compile_s") or 0.0) for p in phases)


def generation_stage(method: str, path: str | None = None) -> str:
    """The roofline stage of the verifier's own answer: the cascade's ``fallback``; the router's (``auto``)
    ``exact`` path, or ``fallback`` when it routed to the cascade and fell back; else the method's name."""
    if method == "speculative" or (method == "auto" and path == "fallback"):
        return "fallback"
    return "exact" if method == "auto" else method


def roofline(trace: Mapping, drafter: ModelCost, verifier: ModelCost, method: str, peaks: MachinePeaks) -> dict:
    """The trace's ``roofline`` entry: per stage measured, bound and ratio (plus FLOPs, bytes, steps). A stage that
    records its own compile seconds (``stage_compile_s``: drafting, verification, evidence verification, the
    verifier's answer and its prefill and decode) is measured without them, as an answer's latency is: ``compile_s``
    says how much was taken out."""
    out = {}
    for stage, (s, cost) in stage_costs(trace, drafter, verifier, method).items():
        compile_s = min(stage_compile_s(trace, stage, method), s)
        out[stage] = StageRoofline(s - compile_s, cost, peaks, compile_s).to_dict()
    return out


def mean_roofline(entries: Iterable[Mapping[str, Mapping]]) -> dict:
    """Per stage over questions: mean measured and bound seconds, the ratio of the means, how many questions."""
    sums: dict[str, list[float]] = {}
    devices: dict[str, dict[str, float]] = {}
    for entry in entries:
        for stage, row in entry.items():
            acc = sums.setdefault(stage, [0.0] * 6)
            for i, key in enumerate(("measured_s", "bound_s", "gflop", "gbytes", "compile_s")):
                acc[i] += row.get(key, 0.0)
            acc[5] += 1
            for name, s in (row.get("device_bound_s") or {}).items():
                devices.setdefault(stage, {}).setdefault(name, 0.0)
                devices[stage][name] += s
    out = {}
    for stage, (m, b, gflop, gbytes, compile_s, n) in sorted(sums.items()):
        out[stage] = {
            "measured_s": _sig(m / n),
            "bound_s": _sig(b / n),
            "ratio": _sig(m / b) if b > 0 else None,
            "questions": int(n),
            "compile_s": _sig(compile_s / n),
        }
        if gflop or gbytes:
            out[stage].update(gflop=_sig(gflop / n), gbytes=_sig(gbytes / n))
        if stage in devices:
            out[stage]["device_bound_s"] = {name: _sig(s / n) for name, s in devices[stage].items()}
    return out


def predicted_bound_s(row: Mapping, peaks: MachinePeaks) -> float:
    """A stage's bound on another machine (``machine_peaks.DEVICE_PEAKS``): the row's ``device_bound_s`` (each
    answer's work part by part, averaged) when it has it, else from its mean FLOPs and bytes taken as one part (for
    a stage of a compute-bound and a memory-bound phase, a lower bound)."""
    if peaks.source in (row.get("device_bound_s") or {}):
        return float(row["device_bound_s"][peaks.source])
    return max(row["gflop"] * 1e9 / peaks.flops_per_s, row["gbytes"] * 1e9 / peaks.bytes_per_s)


def model_cost(model: Any) -> ModelCost:
    """The ModelCost of a loaded TextModel (its runner's config and the bytes of its loaded weights); of a
    ``DeferredTextModel`` not loaded yet, from its config (nothing is loaded for it)."""
    if isinstance(model, DeferredTextModel) and not model.loaded:
        return model.cost()
    runner = model.runner
    weights = sum(x.nbytes for x in jax.tree_util.tree_leaves(runner.params))
    return ModelCost.of(runner.cfg, weights, kv_itemsize=jax.numpy.dtype(runner.dtype).itemsize)


def answer_roofline(rag: Any, trace: Mapping, method: str, peaks: MachinePeaks | None = None) -> dict:
    """``roofline`` of one SpecRAG answer's trace, at ``peaks`` (default: this machine's, measured once)."""
    return roofline(trace, model_cost(rag.drafter), model_cost(rag.verifier), method, peaks or peaks_once())
