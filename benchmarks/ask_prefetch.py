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
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import run_header, write_results

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "How do I leave a loop early in Python?"
ORDER = ("off", "on", "on", "off")


def ask(prefetch: bool, question: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECRAG_PREFETCH_STEPS": "" if prefetch else "0"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "specrag_jax.cli", "ask", question, "--json", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"specrag ask failed:\n{done.stderr[-2000:]}")
    res = json.loads(done.stdout.strip().splitlines()[-1])
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
    order = [ORDER[i % 4] for i in range(2 * args.rounds)]
    warm = {side: ask(side == "on", args.question) for side in ("off", "on")}
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for side in order:
        runs[side].append(ask(side == "on", args.question))
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
