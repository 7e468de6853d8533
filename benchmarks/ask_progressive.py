"""``specrag ask`` with and without ``--progressive-prefill`` over one document K/V store, each a new process.

    python benchmarks/ask_progressive.py --out benchmarks/results/ask_progressive.json

The real default pair, ``--rerank kv`` (the drafter reranks the built-in corpus's candidates) and one
``--kv-store``: one untimed warm-up per side (the first also fills the store and the XLA cache), then off, on,
on, off. Without the flag the direct kv reranker reads the store; with it the drafter's engine serves the
reranker and reads the same store into its prefix cache (``Engine.seed_prefixes``). Reports total and rerank
seconds per side and whether answers, documents and drafts are identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import alternate_off_on, run_header, write_results
from benchmarks.one_core import ROOT, run_cli

QUESTION = "How do I leave a loop early in Python?"


def ask(store: str, progressive: bool, question: str) -> dict:
    args = ["ask", question, "--rerank", "kv", "--kv-store", store, "--json", "-q"]
    out, wall = run_cli(ROOT, args + (["--progressive-prefill"] if progressive else []))
    res = json.loads(out.strip().splitlines()[-1])
    trace = res["trace"]
    return {
        "answer": res["answer"],
        "documents": trace.get("documents"),
        "drafts": [d.get("text") for d in res.get("drafts", [])],
        "total_s": trace.get("total_s"),
        "rerank_s": trace.get("rerank_s"),
        "progressive": trace.get("progressive"),
        "process_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--question", default=QUESTION)
    p.add_argument("--rounds", type=int, default=2, help="timed asks per side after the warm-ups (off, on, on, off..)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as store:
        warm, order, runs = alternate_off_on(lambda on: ask(store, on, args.question), args.rounds)
    every = [r for side in runs for r in runs[side]] + list(warm.values())
    outputs = [(r["answer"], r["documents"], r["drafts"]) for r in every]
    same = all(o == outputs[0] for o in outputs)
    mean = {side: {k: statistics.mean(r[k] for r in runs[side]) for k in ("total_s", "rerank_s")} for side in runs}
    result = {
        **run_header(),
        "question": args.question,
        "order": ["warm-up off", "warm-up on", *order],
        "mean": mean,
        "on_over_off_total": mean["on"]["total_s"] / mean["off"]["total_s"],
        "identical_answers_documents_drafts": same,
        "warmup": warm,
        "runs": runs,
    }
    print(json.dumps({k: result[k] for k in ("mean", "on_over_off_total", "identical_answers_documents_drafts")}))
    if args.out:
        write_results(args.out, result)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
