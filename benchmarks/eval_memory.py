"""Host memory of a long eval: with and without handing freed heap back to the OS after each question and a
bound on the compiled step programs each model keeps.

``evaluate`` calls ``host_memory.release_free_heap`` after every question and keeps at most
``EVAL_HELD_PROGRAMS`` step programs per model (``step_export.held_programs``). This runs the same questions in
two fresh processes, "off" (no release, every program kept: the code before) and "on" (both, the bound from
``--held``), and reports each process's resident and anonymous memory after every question, its peak, the
compile time (reloads of dropped programs count there), the latency, and whether the answers agree.

    python benchmarks/eval_memory.py --data ../shared/data/retrievalqa_dev.jsonl --split heldout --limit 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results
from specrag_jax import host_memory


def _sizes() -> dict:
    return {k: host_memory.status_mib(k) for k in ("VmRSS", "RssAnon")}


def run_arm(args: argparse.Namespace) -> dict:
    """One process: build the default pair, evaluate, record memory after each question."""
    import specrag_jax.evaluation.run as evaluation
    from specrag_jax.evaluation.holdout import split_rows
    from specrag_jax.evaluation.run import evaluate, load_questions
    from specrag_jax.pipeline.factory import build_specrag
    from specrag_jax.xla_cache import enable_xla_cache

    enable_xla_cache()
    rows = split_rows(load_questions(args.data), args.split)[: args.limit]
    rag = build_specrag()
    after_load = _sizes()
    series: list[dict] = []

    def recorded_release() -> float | None:
        held = host_memory.status_mib("RssAnon")
        released = host_memory.release_free_heap() if args.arm == "on" else None
        series.append({"t": round(time.monotonic(), 1), "anon_before": held, **_sizes()})
        return released

    evaluation.release_free_heap = recorded_release
    evaluation.EVAL_HELD_PROGRAMS = args.held if args.arm == "on" else None
    res = evaluate(rag, rows, args.methods.split(","), progress=False)
    return {
        "arm": args.arm,
        "after_load_mib": after_load,
        "per_question_mib": series,
        "peak_rss_mib": host_memory.status_mib("VmHWM"),
        "host_memory": res["host_memory"],
        "accuracy": {m: v["accuracy"] for m, v in res["methods"].items()},
        "compile_s": {m: round(v["compile_s"], 2) for m, v in res["methods"].items()},
        "latency_mean_s": {m: round(v["latency_s"]["mean"], 2) for m, v in res["methods"].items()},
        "wall_mean_s": {m: round(v["wall_s"]["mean"], 2) for m, v in res["methods"].items()},
        "answers": [p["answer"] for p in res["predictions"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="../shared/data/retrievalqa_dev.jsonl")
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--methods", default="speculative,standard")
    ap.add_argument("--held", type=int, default=24, help="step programs kept per model in the 'on' arm")
    ap.add_argument("--arm", choices=("on", "off"), help=argparse.SUPPRESS)  # a child process
    ap.add_argument("--out", default="benchmarks/results/eval_memory.json")
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args)))
        return
    arms = {}
    for arm in ("off", "on"):
        cmd = [sys.executable, __file__, "--arm", arm, "--data", args.data, "--split", args.split]
        cmd += ["--limit", str(args.limit), "--methods", args.methods, "--held", str(args.held)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        arms[arm] = json.loads(done.stdout.strip().splitlines()[-1])
    write_results(
        Path(args.out),
        {
            **run_header(),
            "questions": args.limit,
            "held_programs_on": args.held,
            "split": args.split,
            "arms": arms,
            "same_answers": arms["off"]["answers"] == arms["on"]["answers"],
            "peak_rss_mib": {a: arms[a]["peak_rss_mib"] for a in arms},
            "final_anon_mib": {a: arms[a]["per_question_mib"][-1]["RssAnon"] for a in arms},
        },
    )


if __name__ == "__main__":
    main()
