"""Every stage against its bound (issue 22): measured seconds vs the seconds its FLOPs and bytes need at this
machine's peak matmul rate and memory bandwidth, both measured in the same run, per method and stage.

Runs ``specrag eval``'s ``evaluate`` on dev questions with the default pair (standard, speculative = the cascade,
lossless), whose JSON carries ``roofline`` per stage (``pipeline/roofline.py``), on the last of ``--passes``
passes over the same questions (the earlier ones compile every step shape), and adds the same stages' bounds on
an H200 and a TPU v5e from their published peaks: a prediction for the device check to confirm. Writes
``benchmarks/results/roofline.json``.

    python benchmarks/roofline.py --data ../shared/data/retrievalqa_dev.jsonl --split heldout --limit 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results
from specrag_jax.compile_time import CompileClock
from specrag_jax.evaluation.holdout import split_rows
from specrag_jax.evaluation.run import evaluate, load_questions
from specrag_jax.machine_peaks import DEVICE_PEAKS, device_peaks, measure_peaks
from specrag_jax.models.executor.packing import token_count_buckets
from specrag_jax.pipeline.factory import build_specrag
from specrag_jax.pipeline.roofline import predicted_bound_s
from specrag_jax.xla_cache import enable_xla_cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="../shared/data/retrievalqa_dev.jsonl")
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--methods", default="speculative,standard,lossless")
    ap.add_argument(
        "--passes",
        type=int,
        default=2,
        help="answer the questions this many times and report the last pass (the first compiles)",
    )
    ap.add_argument("--out", default="benchmarks/results/roofline.json")
    args = ap.parse_args()
    enable_xla_cache()
    rows = split_rows(load_questions(args.data), args.split)[: args.limit]
    peaks_before = measure_peaks()
    rag = build_specrag()
    with CompileClock() as clock:
        for _ in range(max(args.passes - 1, 0)):  # same questions, same step shapes: every program compiles here
            evaluate(rag, rows, args.methods.split(","), progress=True)
    with CompileClock() as measured_clock:
        results = evaluate(rag, rows, args.methods.split(","), progress=True)
    peaks_after = measure_peaks()
    table = {}
    for method, m in results["methods"].items():
        stages = {}
        for stage, row in m["roofline"].items():
            pred = {
                name: round(predicted_bound_s(row, device_peaks(name)) * 1e3, 3)
                for name in DEVICE_PEAKS
                if "gflop" in row
            }
            stages[stage] = {**row, "predicted_bound_ms": pred}
        table[method] = {"accuracy": m["accuracy"], "latency_s": m["latency_s"]["mean"], "stages": stages}
    write_results(
        Path(args.out),
        {
            **run_header(),
            "questions": len(rows),
            "split": args.split,
            "peaks_before": peaks_before.to_dict(),
            "peaks_after": peaks_after.to_dict(),
            "peaks_used": results["roofline_peaks"],
            "device_peaks": DEVICE_PEAKS,
            "token_buckets_to_2048": token_count_buckets(16, 2048),
            "xla_warmup_passes": clock.stats.summary(),
            "xla_measured_pass": measured_clock.stats.summary(),
            "passes": args.passes,
            "methods": table,
        },
    )


if __name__ == "__main__":
    main()
