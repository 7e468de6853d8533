"""A second ``specrag ask`` with and without loading its step programs ahead (``step_prefetch``), each a new process.

    python benchmarks/ask_prefetch.py --out benchmarks/results/ask_prefetch.json

The real default pair on the built-in corpus, the XLA cache and stored exports filled by one untimed warm-up per
side; then off, on, on, off (``SPECRAG_PREFETCH_STEPS=0`` / the default). Reports per side the process's wall
time, the answer's seconds, the XLA seconds on the answering thread (``compile_s``) and on the background thread
(``xla_background``), and whether answers and drafts are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import alternate_off_on, run_header, write_results
from benchmarks.one_core import ROOT, run_cli

QUESTION = "How do I leave a loop early in Python?"


def ask(prefetch: bool, question: str) -> dict:
    os.environ["SPECRAG_PREFETCH_STEPS"] = "" if prefetch else "0"  # run_cli passes this process's environment on
    out, wall = run_cli(ROOT, ["ask", question, "--json", "-q"])
    res = json.loads(out.strip().splitlines()[-1])
    trace = res["trace"]
    return {
        "answer": res["answer"],
        "drafts": [d.get("text") for d in res.get("drafts", [])],
        "process_s": wall,
        "total_s": trace.get("total_s"),
        "xla_answer_thread_s": trace.get("compile_s"),
        "xla_background_s": trace.get("xla_background", {}).get("seconds", 0.0),
        "xla_background_programs": trace.get("xla_background", {}).get("programs", 0),
        "drafting_s": trace.get("drafting_s"),
        "verification_s": trace.get("verification_s"),
        "generation_s": trace.get("generation_s"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--question", default=QUESTION)
    p.add_argument("--rounds", type=int, default=2, help="timed asks per side after the warm-ups (off, on, on, off..)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    warm, order, runs = alternate_off_on(lambda on: ask(on, args.question), args.rounds)
    every = [r for side in runs for r in runs[side]] + list(warm.values())
    same = all((r["answer"], r["drafts"]) == (every[0]["answer"], every[0]["drafts"]) for r in every)
    keys = ("process_s", "total_s", "xla_answer_thread_s", "xla_background_s")
    mean = {side: {k: statistics.mean(r[k] for r in runs[side]) for k in keys} for side in runs}
    result = {
        **run_header(),
        "question": args.question,
        "order": ["warm-up off", "warm-up on", *order],
        "mean": mean,
        "on_minus_off_process_s": mean["on"]["process_s"] - mean["off"]["process_s"],
        "identical_answers_and_drafts": same,
        "warmup": warm,
        "runs": runs,
    }
    print(json.dumps({k: result[k] for k in ("mean", "on_minus_off_process_s", "identical_answers_and_drafts")}))
    if args.out:
        write_results(args.out, result)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
