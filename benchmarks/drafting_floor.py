"""Drafting's floor on this machine (issue 22): how close to its bound can drafting get at all?

The roofline holds drafting to the time its FLOPs need at the measured matmul peak (a large product's) and its
bytes at the measured read bandwidth. This measures what the same steps cost on this CPU when the one part an
implementation of ours decides, attention over the cached K/V, costs nothing: the steps' products, head,
norms, K/V writes and sampling as XLA:CPU runs them.

Per question (the pipeline's drafts, as ``drafting_steps.py`` writes them, once to compile and once timed) every
engine step of the timed pass is kept. The steps are then replayed in ``--rounds`` rounds of two sides in
alternating order, each on the K/V pool as the timed pass left it (a copy restored before every replay): ``real``
(the same programs: each step writes the K/V it wrote before and reads the prefix it read) and ``stub`` (the
decoder's attention replaced by a stub returning its queries, ``layers.paged_attention``; programs retraced).
Each side compiles in an untimed replay; a step's time is its fastest over the rounds. The pairing matters on a VM
whose speed drifts by 1.3-2x within an hour: both sides run in the same minutes. Per step and summed by part
(prompt prefill, the forced tag's prefill, decode):

- ``measured_s``: the real replay (``pass_s``: the timed pass itself, for comparison);
- ``floor_s``: the stub replay, the same step without attention (its host work included: packing the step,
  the sampling batch, the transfers and reading the tokens back);
- ``bound_s``: the step's own bound (``ModelCost.step``: 2 FLOPs per weight per token, the head for its logits
  rows, 4 * heads * head_dim per visible pair; the weights read once plus the K/V it reads) at this run's peaks.
  Summed step by step it is at least the eval's drafting bound, which counts the prompt as one prefill (the
  tag steps' weight reads not apart) and the decode steps at the mean context.

``floor_s / bound_s`` is how close drafting could come if its attention were free; ``measured_s - floor_s`` is
what attention costs. Programs go through the persistent XLA cache (each side's compile once); the stored step
exports (keyed by the sources, which the stub does not change) are off.

    python benchmarks/drafting_floor.py --questions 6 --out benchmarks/results/drafting_floor.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import load_tuned_drafter, run_header, write_results
from benchmarks.drafting_steps import TAG_STEP_TOKENS, add_question_args, question_subsets, timed_steps

PARTS = ("prefill", "tag_prefill", "decode")


def part_of(work) -> str:
    """The drafting part a recorded engine step belongs to (``drafting_steps.split_question``'s classes)."""
    if work.decodes:
        return "decode"
    return "tag_prefill" if sum(len(c.tokens) for c in work.chunks) <= TAG_STEP_TOKENS else "prefill"


def step_cost(cost, work):
    """The ``Cost`` of one engine step: its tokens, the (query, key) pairs its chunks see, the K/V it reads."""
    from specrag_jax.models.executor.cost import causal_pairs

    tokens = sum(len(c.tokens) for c in work.chunks)
    pairs = sum(causal_pairs(len(c.tokens), c.kv_len) for c in work.chunks)
    context = sum(c.kv_len for c in work.chunks)
    rows = sum(len(c.rows) for c in work.chunks)
    return cost.step(tokens, pairs, context=context, logits_rows=rows)


def kept_steps(kept: list):
    """Patch ``Work.run`` so every engine step is timed and kept (work, runner, config, seconds); returns the
    unpatched ``Work.run`` and the undo."""
    return timed_steps(lambda work, runner, cfg, seconds: kept.append([work, runner, cfg, seconds]))


def replay(steps_kept: list, run_step, pool) -> list[float]:
    """Each kept step once more through ``run_step`` (the unpatched ``Work.run``; the runner returns numpy, so the
    step has finished when it returns) on a copy of ``pool``, timed: its seconds."""
    import jax
    import jax.numpy as jnp

    steps_kept[0][1].pool = jax.tree_util.tree_map(jnp.copy, pool)
    out = []
    for work, runner, cfg, _ in steps_kept:
        t = time.perf_counter()
        run_step(work, runner, cfg)
        out.append(time.perf_counter() - t)
    return out


def paired_replays(steps_kept: list, run_step, rounds: int) -> dict[str, list[float]]:
    """Per step, its fastest replay over ``rounds`` on each side: ``real`` attention and the ``stub``."""
    import jax
    import jax.numpy as jnp

    from specrag_jax.models.decoder import layers

    runner = steps_kept[0][1]
    assert all(kept[1] is runner for kept in steps_kept), "every step of one drafting pass runs on one runner"
    pool = jax.tree_util.tree_map(jnp.copy, runner.pool)  # the pool as the timed pass left it
    attention = layers.paged_attention
    best: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            for side in ("real", "stub") if r % 2 == 0 else ("stub", "real"):
                layers.paged_attention = attention if side == "real" else _no_attention
                jax.clear_caches()  # a trace-time switch: retrace (the persistent cache serves the compiles)
                replay(steps_kept, run_step, pool)  # compiles
                times = replay(steps_kept, run_step, pool)
                best[side] = [min(a, b) for a, b in zip(best[side], times)] if side in best else times
    finally:
        layers.paged_attention = attention
        runner.pool = pool
        jax.clear_caches()
    return best


def _no_attention(q, *args, **kwargs):
    """Attention that costs nothing: each query head's output is its query."""
    return q


SUMS = ("steps", "pass_s", "measured_s", "floor_s", "bound_s")


def summarise(steps_kept, measured, floors, cost, peaks) -> dict:
    """Pass, measured (real replay), floor and bound seconds of one question's steps, by part and in all."""
    by_part = {p: dict.fromkeys(SUMS, 0.0) | {"steps": 0} for p in PARTS}
    for (work, _, _, pass_s), real, floor in zip(steps_kept, measured, floors, strict=True):
        entry = by_part[part_of(work)]
        entry["steps"] += 1
        entry["pass_s"] += pass_s
        entry["measured_s"] += real
        entry["floor_s"] += floor
        entry["bound_s"] += step_cost(cost, work).bound_s(peaks.flops_per_s, peaks.bytes_per_s)
    total = {k: sum(by_part[p][k] for p in PARTS) for k in SUMS}
    return {"by_part": by_part, "total": total}


def ratios(entry: dict) -> dict:
    """measured / bound, floor / bound and attention's share of the measured seconds."""
    bound, floor, measured = entry["bound_s"], entry["floor_s"], entry["measured_s"]
    return {
        "measured_over_bound": measured / bound if bound else None,
        "floor_over_bound": floor / bound if bound else None,
        "attention_share": (measured - floor) / measured if measured else None,
    }


def main(argv: list[str] | None = None) -> int:
    import jax

    from specrag_jax.machine_peaks import measure_peaks
    from specrag_jax.models.executor import step_export
    from specrag_jax.pipeline.drafting import write_drafts
    from specrag_jax.pipeline.roofline import model_cost
    from specrag_jax.xla_cache import enable_xla_cache

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_question_args(p)
    p.add_argument("--rounds", type=int, default=2, help="replay rounds per side (a step's fastest counts)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    # Stored step exports are keyed by the sources, not by a patched attention: off, so the stub side retraces.
    os.environ[step_export.ENV] = "off"
    enable_xla_cache()  # compiled programs keyed by their HLO: each side compiles once
    drafter = load_tuned_drafter(args.m)
    cost = model_cost(drafter)
    peaks = measure_peaks()
    kept: list = []
    run_step, undo = kept_steps(kept)
    per_question = []
    try:
        for row, subsets in question_subsets(drafter, args):
            write_drafts(drafter, row["question"], subsets)  # compiles this question's step shapes
            kept.clear()
            t = time.perf_counter()
            write_drafts(drafter, row["question"], subsets)
            total = time.perf_counter() - t
            best = paired_replays(kept, run_step, args.rounds)
            entry = {"question_id": row["question_id"], "drafting_s": total}
            entry.update(summarise(kept, best["real"], best["stub"], cost, peaks))
            entry["total"].update(ratios(entry["total"]))
            per_question.append(entry)
            print(row["question_id"], {k: round(v, 3) for k, v in entry["total"].items()}, flush=True)
    finally:
        undo()
    keys = SUMS[1:]
    means = {part: {k: statistics.mean(q["by_part"][part][k] for q in per_question) for k in keys} for part in PARTS}
    means["total"] = {k: sum(means[p][k] for p in PARTS) for k in keys}
    for entry in means.values():
        entry.update(ratios(entry))
    result = {**run_header(), "peaks": peaks.to_dict(), "peaks_after": measure_peaks().to_dict()}
    result.update(m=args.m, k=args.k, split=args.split, rounds=args.rounds, mean_by_part=means)
    result["per_question"] = per_question
    for part, entry in means.items():
        print(part, {k: round(v, 3) for k, v in entry.items()})
    if args.out:
        write_results(args.out, result)
    jax.clear_caches()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
