"""``specrag eval --concurrency N`` against one question at a time, in one run on one machine (issue 23).

Runs ``specrag eval --limit Q --methods standard,speculative`` as subprocesses on the same dev questions with
each concurrency level: first an untimed warm-up of each level (it fills the XLA cache: without it the first
run pays every compilation and the comparison measures the cache), then N, 1, 1, N (drift cancels), and reports
the throughput (method answers per second of the process's wall time: loading and compilation included) and
whether every answer and draft is the same (greedy).

    python benchmarks/eval_concurrency.py --questions 6 --concurrency 2 \\
        --out benchmarks/results/eval_concurrency.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "retrievalqa_dev.jsonl"
METHODS = "standard,speculative"


def _eval(data: str, questions: int, concurrency: int) -> dict:
    """One ``specrag eval`` process: its wall time (model loading and compilation included), the per-method
    figures and the predictions."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["eval", "--data", data, "--limit", str(questions), "--methods", METHODS, "--out", tmp, "-q"]
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "specrag_jax.cli", *args, "--concurrency", str(concurrency)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
        )
        process_s = time.perf_counter() - t0
        if done.returncode:
            raise SystemExit(f"eval --concurrency {concurrency} failed:\n{done.stderr[-2000:]}")
        results = json.loads((Path(tmp) / "results.json").read_text())
        preds = [json.loads(line) for line in (Path(tmp) / "predictions.jsonl").read_text().splitlines()]
    methods = results["methods"]
    return {
        "process_s": process_s,
        "latency_s_mean": {m: methods[m]["latency_s"]["mean"] for m in methods},
        "compile_s": {m: methods[m]["compile_s"] for m in methods},
        "accuracy": {m: methods[m]["accuracy"] for m in methods},
        "predictions": {
            f"{p['method']}/{p['question_id']}": [p["answer"], p.get("chosen_draft")]
            + [d.get("text") for d in p.get("drafts") or []]
            for p in preds
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(DEV))
    p.add_argument("--questions", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    n = args.concurrency
    for level in (1, n):
        print(f"warm-up, concurrency {level}: {_eval(args.data, args.questions, level)['process_s']:.1f} s", flush=True)
    runs: dict[int, list[dict]] = {1: [], n: []}
    in_order = []
    for level in (n, 1, 1, n):
        runs[level].append(_eval(args.data, args.questions, level))
        in_order.append({"concurrency": level, "process_s": runs[level][-1]["process_s"]})
        print(f"concurrency {level}: {runs[level][-1]['process_s']:.1f} s", flush=True)
    reference = runs[1][0]["predictions"]
    diff = sorted({k for rs in runs.values() for r in rs for k, v in r["predictions"].items() if reference[k] != v})
    process = {level: statistics.mean(r["process_s"] for r in rs) for level, rs in runs.items()}
    answers = args.questions * len(METHODS.split(","))
    result = {
        **run_header(),
        "questions": args.questions,
        "methods": METHODS,
        "process_s_mean": process,
        "method_answers_per_s": {level: answers / s for level, s in process.items()},
        "speedup": process[1] / process[args.concurrency],
        "latency_s_mean": {
            level: {m: statistics.mean(r["latency_s_mean"][m] for r in rs) for m in rs[0]["latency_s_mean"]}
            for level, rs in runs.items()
        },
        "compile_s_mean": {
            level: {m: statistics.mean(r["compile_s"][m] for r in rs) for m in rs[0]["compile_s"]}
            for level, rs in runs.items()
        },
        "accuracy": {level: rs[0]["accuracy"] for level, rs in runs.items()},
        "differing_predictions": diff,
        "runs_per_level": 2,
        "runs_in_order": in_order,  # after one untimed warm-up run per level
    }
    print(json.dumps({k: result[k] for k in ("process_s_mean", "speedup", "latency_s_mean")}, indent=1))
    if args.out:
        write_results(args.out, result)
    return 0 if not diff else 1


if __name__ == "__main__":
    raise SystemExit(main())
