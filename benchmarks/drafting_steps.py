"""Where drafting's time goes, step by step (issue 22: "drafting at its bound").

The default drafter (SmolLM2-135M with its tuned adapter) writes the m drafts of each question as the pipeline
does (lexical subsets, passages cut to 160 tokens, ``write_drafts``), once to compile and once timed; every engine
step of the timed pass is recorded (its kind, live sequences, padded rows, tokens, cached tokens it attends to,
and its wall time: packing, the device call and reading the sampled tokens back). Reported per question and in
all:

- the split of drafting's wall time into prompt prefill steps, the phase-2 steps that prefill only the forced
  "## Response:" tag (at most 16 tokens: one whole read of the weights each), decode steps, and host time outside
  the steps;
- decode steps by live sequences (a decode step keeps its first width while drafts finish, ``sticky_rows``);
- a least-squares fit over the full-width decode steps, ``step_ms = fixed + per_kv_token * cached tokens``: the
  fixed part is the weight read plus the per-step overheads (set against the weight-read bound at this machine's
  measured bandwidth), the per-token part is attention over the cached K/V (set against reading those bytes).

    python benchmarks/drafting_steps.py --data ../shared/data/retrievalqa_dev.jsonl --questions 6
    python benchmarks/drafting_steps.py --ab --questions 6 --out benchmarks/results/drafting_prefix_segments.json

    python benchmarks/drafting_steps.py --ab decode --questions 6 --out benchmarks/results/drafting_packed_decode.json
    python benchmarks/drafting_steps.py --ab rows --questions 4 --out benchmarks/results/drafting_padded_rows.json
    python benchmarks/drafting_steps.py --ab heads --questions 6 --out benchmarks/results/drafting_stacked_heads.json

``--ab`` compares two forms of one kernel choice in one process: per question both sides, each after dropping
the traced programs and compiling its own, in alternating order; the drafts must be identical (greedy).
``prefix``: the multi-sequence prefill's prefix read sequence by sequence (``kernels/prefix_segments.py``)
against scoring every token against every sequence's key block (``kernels.blocked.SEGMENTED_PREFIX`` off).
``decode``: decode attention over packed (row, block) pairs against every row reading the longest row's blocks
in lockstep (``kernels.decode_blocked.PACKED_DECODE`` off). ``rows``: few-rows products of 5-7 rows run at 8
(``models.decoder.linear.PADDED_ROWS``) against at their own row count (``linear.PAD_FEW_ROWS`` off). ``heads``:
decode attention's block products over all KV heads side by side (``kernels.decode_blocked``'s stacked form)
against batched per KV head (``decode_blocked.STACKED_HEADS`` off).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import load_tuned_drafter, run_header, write_results

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "retrievalqa_dev.jsonl"
TAG_STEP_TOKENS = 16  # a non-decode step of at most this many tokens: a phase's forced tag, prefilled alone
AB_SIDES = {  # (new, old)
    "prefix": ("segmented", "one_hot"),
    "decode": ("packed", "lockstep"),
    "rows": ("padded_rows", "exact_rows"),
    "heads": ("stacked_heads", "grouped_heads"),
}


def timed_steps(on_step):
    """Patch ``Work.run`` so every engine step calls ``on_step(work, runner, cfg, seconds)`` after it runs;
    returns the unpatched ``Work.run`` and the undo function."""
    from specrag_jax.models.engine import steps

    original = steps.Work.run

    def run(self, runner, cfg):
        t = time.perf_counter()
        out = original(self, runner, cfg)
        on_step(self, runner, cfg, time.perf_counter() - t)
        return out

    steps.Work.run = run
    return original, lambda: setattr(steps.Work, "run", original)


def recorded_steps(log: list[dict]):
    """Patch ``Work.run`` so every engine step appends its record to ``log``; returns the undo function."""

    def record(work, runner, cfg, seconds: float) -> None:
        log.append(
            {
                "kind": work.kind,
                "decode": work.decodes,
                "live": len(work.chunks),
                "rows": work.rows,
                "tokens": sum(len(c.tokens) for c in work.chunks),
                "cached": sum(c.kv_len for c in work.chunks),
                "s": seconds,
            }
        )

    return timed_steps(record)[1]


def split_question(log: list[dict], total_s: float) -> dict:
    """One timed drafting pass: seconds by step class and decode steps by live sequences."""
    decode = [e for e in log if e["decode"]]
    tags = [e for e in log if not e["decode"] and e["tokens"] <= TAG_STEP_TOKENS]
    prefill = [e for e in log if not e["decode"] and e["tokens"] > TAG_STEP_TOKENS]
    by_live = collections.defaultdict(list)
    for e in decode:
        by_live[e["live"]].append(e["s"])
    in_steps = sum(e["s"] for e in log)
    return {
        "drafting_s": total_s,
        "prefill": {"steps": len(prefill), "tokens": sum(e["tokens"] for e in prefill), "s": _sum(prefill)},
        "tag_prefill": {"steps": len(tags), "s": _sum(tags)},
        "decode": {
            "steps": len(decode),
            "s": _sum(decode),
            "median_step_ms": 1e3 * statistics.median(e["s"] for e in decode) if decode else None,
            "by_live_sequences": {n: {"steps": len(v), "s": sum(v)} for n, v in sorted(by_live.items())},
        },
        "host_outside_steps_s": total_s - in_steps,
    }


def _sum(entries: list[dict]) -> float:
    return float(sum(e["s"] for e in entries))


def fit_decode(steps: list[dict], weight_bytes: float, kv_bytes_per_token: float, bytes_per_s: float) -> dict:
    """``step_s = fixed + per_token * cached`` over full-width decode steps, against the bounds."""
    x = np.asarray([e["cached"] for e in steps], np.float64)
    y = np.asarray([e["s"] for e in steps], np.float64)
    per_token, fixed = np.polyfit(x, y, 1)
    mean_cached = float(x.mean())
    return {
        "steps": len(steps),
        "fixed_ms": 1e3 * float(fixed),
        "weight_read_bound_ms": 1e3 * weight_bytes / bytes_per_s,
        "per_kv_token_us": 1e6 * float(per_token),
        "kv_read_bound_us_per_token": 1e6 * kv_bytes_per_token / bytes_per_s,
        "mean_cached_tokens": mean_cached,
        "attention_share_at_mean": float(per_token * mean_cached / (fixed + per_token * mean_cached)),
        "r2": float(np.corrcoef(x, y)[0, 1] ** 2) if len(steps) > 2 else None,
    }


def side_summary(per_question: list[dict], full_width: list[dict], cost, peaks) -> dict:
    """Means over the questions by part, their shares, and the full-width decode fit of one side."""
    parts = ("prefill", "tag_prefill", "decode")
    totals = {key: statistics.mean(q[key]["s"] for q in per_question) for key in parts}
    totals["host_outside_steps"] = statistics.mean(q["host_outside_steps_s"] for q in per_question)
    drafting = statistics.mean(q["drafting_s"] for q in per_question)
    return {
        "drafting_s_mean": drafting,
        "mean_s_by_part": totals,
        "share_by_part": {k: v / drafting for k, v in totals.items()},
        "full_width_decode_fit": fit_decode(full_width, cost.weight_bytes, cost.kv_bytes_per_token, peaks.bytes_per_s),
        "per_question": per_question,
    }


def add_question_args(p: argparse.ArgumentParser) -> None:
    """The questions' flags: the data file, its split, how many, drafts (m) and passages a draft (k)."""
    p.add_argument("--data", default=str(DEV))
    p.add_argument("--split", default="heldout")
    p.add_argument("--questions", type=int, default=6)
    p.add_argument("--m", type=int, default=5)
    p.add_argument("--k", type=int, default=2)


def question_subsets(drafter, args: argparse.Namespace):
    """Yields (row, subsets) of each question as the pipeline drafts it: its first 10 passages cut to 160 tokens,
    ``args.m`` lexical subsets of ``args.k``."""
    from specrag_jax.evaluation.holdout import split_rows
    from specrag_jax.evaluation.run import _row_docs, load_questions
    from specrag_jax.pipeline.clustering import lexical_subsets
    from specrag_jax.pipeline.drafting import truncate_docs

    subsets_fn = lexical_subsets()
    for row in split_rows(load_questions(args.data), args.split)[: args.questions]:
        docs = truncate_docs(drafter, _row_docs(row)[:10], 160, [])
        picked, _ = subsets_fn(row["question"], docs, args.k, args.m, 0)
        yield row, [[docs[j] for j in s] for s in picked]


def main(argv: list[str] | None = None) -> int:
    import jax

    from specrag_jax.kernels import blocked, decode_blocked
    from specrag_jax.machine_peaks import measure_peaks
    from specrag_jax.models.decoder import linear
    from specrag_jax.pipeline.drafting import write_drafts
    from specrag_jax.pipeline.roofline import model_cost

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_question_args(p)
    p.add_argument(
        "--ab",
        nargs="?",
        const="prefix",
        choices=sorted(AB_SIDES),
        help="both forms of a kernel choice, alternated per question (bare --ab: the prefix read)",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    drafter = load_tuned_drafter(args.m)
    cost = model_cost(drafter)
    peaks = measure_peaks()
    log: list[dict] = []
    undo = recorded_steps(log)
    sides = AB_SIDES[args.ab] if args.ab else ("default",)
    per_question: dict[str, list[dict]] = {side: [] for side in sides}
    full_width: dict[str, list[dict]] = {side: [] for side in sides}
    try:
        for i, (row, subsets) in enumerate(question_subsets(drafter, args)):
            for side in sides if i % 2 == 0 else sides[::-1]:
                # trace-time switches: drop every traced program
                blocked.SEGMENTED_PREFIX = side != "one_hot"
                decode_blocked.PACKED_DECODE = side != "lockstep"
                linear.PAD_FEW_ROWS = side != "exact_rows"
                decode_blocked.STACKED_HEADS = side != "grouped_heads"
                jax.clear_caches()
                write_drafts(drafter, row["question"], subsets)  # compiles this question's step shapes
                log.clear()
                t = time.perf_counter()
                drafts, _ = write_drafts(drafter, row["question"], subsets)
                total = time.perf_counter() - t
                texts = hashlib.sha256(json.dumps([d.text for d in drafts]).encode()).hexdigest()[:16]
                entry = {"question_id": row["question_id"], "drafts_sha256": texts, **split_question(log, total)}
                per_question[side].append(entry)
                full_width[side] += [e for e in log if e["decode"] and e["live"] == len(subsets)]
                print(side, entry, flush=True)
    finally:
        undo()
        blocked.SEGMENTED_PREFIX = decode_blocked.PACKED_DECODE = linear.PAD_FEW_ROWS = True
        decode_blocked.STACKED_HEADS = True
    result = {**run_header(), "peaks": peaks.to_dict(), "m": args.m, "k": args.k, "split": args.split}
    result["sides"] = {side: side_summary(per_question[side], full_width[side], cost, peaks) for side in sides}
    if args.ab:
        same = [a["drafts_sha256"] == b["drafts_sha256"] for a, b in zip(*per_question.values())]
        assert all(same), f"the drafts differ between the {args.ab} forms"
        new, old = (result["sides"][side] for side in sides)
        ratios = {"drafting": new["drafting_s_mean"] / old["drafting_s_mean"]}
        ratios.update({k: v / old["mean_s_by_part"][k] for k, v in new["mean_s_by_part"].items()})
        result.update(drafts_identical=True, **{f"{sides[0]}_over_{sides[1]}": ratios})
        print(f"{sides[0]} / {sides[1]}:", {k: round(v, 3) for k, v in ratios.items()})
    for side in sides:
        print(side, {k: round(v, 3) for k, v in result["sides"][side]["mean_s_by_part"].items()})
        print(side, result["sides"][side]["full_width_decode_fit"])
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
