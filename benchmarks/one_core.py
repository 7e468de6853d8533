"""The one-engine-core refactor (issue 23 item 1) against the code before it, in one run on one machine.

``--before DIR`` is a checkout of the commit before the refactor (``git worktree add DIR 3ce80da``); the current
checkout is "after". Both run the same commands as subprocesses on the same dev questions (the default pair,
real models, the same XLA compilation cache), alternating before / after / after / before so drift cancels:

- ``ask``: ``specrag ask --json`` on each question (one warm-up ask per side first, not counted); the answer
  and the trace's ``total_s`` (the pipeline's own time, loading excluded) per question;
- ``eval``: ``specrag eval --limit N --methods standard,speculative``, each side twice in the same alternating
  order (questions per second of its ``wall_s``, compilation included, and the per-method latency without
  compilation, both averaged over a side's runs).

Answers, drafts and the chosen draft must be identical (greedy): the script reports any difference.

    python benchmarks/one_core.py --before /work/before --questions 3 --eval-questions 6 \\
        --out benchmarks/results/one_core.json
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
ORDER = ("before", "after", "after", "before")


def run_cli(tree: Path, args: list[str]) -> tuple[str, float]:
    """stdout of ``python -m specrag_jax.cli ARGS`` with ``tree``'s package first on the path, and its wall time."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "specrag_jax.cli", *args], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"{tree}: specrag {' '.join(args[:1])} failed:\n{done.stderr[-2000:]}")
    return done.stdout, time.perf_counter() - t0


def _ask(tree: Path, question: str) -> dict:
    out, wall = run_cli(tree, ["ask", "--json", "-q", question])
    res = json.loads(out.strip().splitlines()[-1])
    return {
        "answer": res["answer"],
        "drafts": [d.get("text") for d in res.get("drafts", [])],
        "total_s": res["trace"].get("total_s"),
        "process_s": wall,
    }


def _eval(tree: Path, data: str, n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        _, wall = run_cli(tree, ["eval", "--data", data, "--limit", str(n), "--methods", "standard,speculative",
                              "--out", tmp, "-q"])  # fmt: skip
        results = json.loads((Path(tmp) / "results.json").read_text())
        preds = [json.loads(line) for line in (Path(tmp) / "predictions.jsonl").read_text().splitlines()]
    methods = results["methods"]
    return {
        "process_s": wall,
        "wall_s": {m: methods[m]["wall_s"]["mean"] * methods[m]["n"] for m in methods},
        "latency_s_mean": {m: methods[m]["latency_s"]["mean"] for m in methods},
        "compile_s": {m: methods[m]["compile_s"] for m in methods},
        "accuracy": {m: methods[m]["accuracy"] for m in methods},
        "predictions": prediction_table(preds),
    }


def prediction_table(preds: list[dict]) -> dict[str, list]:
    """method/question -> [answer, chosen draft, every draft's text] of an eval's predictions."""
    return {
        f"{p['method']}/{p['question_id']}": [p["answer"], p.get("chosen_draft")]
        + [d.get("text") if isinstance(d, dict) else d for d in p.get("drafts") or []]
        for p in preds
    }


def commit_of(tree: Path) -> str:
    """The checked-out commit of ``tree``."""
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def _mean_eval(runs: list[dict]) -> dict:
    """The per-run figures of one side's eval runs, averaged (predictions compared separately)."""
    return {
        "process_s": statistics.mean(r["process_s"] for r in runs),
        "wall_s": {m: statistics.mean(r["wall_s"][m] for r in runs) for m in runs[0]["wall_s"]},
        "latency_s_mean": {m: statistics.mean(r["latency_s_mean"][m] for r in runs) for m in runs[0]["wall_s"]},
        "compile_s": {m: statistics.mean(r["compile_s"][m] for r in runs) for m in runs[0]["wall_s"]},
        "accuracy": runs[0]["accuracy"],
        "runs": len(runs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="a checkout of the commit before the refactor")
    p.add_argument("--data", default=str(DEV))
    p.add_argument("--questions", type=int, default=3, help="dev questions asked with `specrag ask`")
    p.add_argument("--eval-questions", type=int, default=6)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    trees = {"before": Path(args.before).resolve(), "after": ROOT}
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()[: args.questions]]
    questions = [r["question"] for r in rows]
    for side in trees:  # warm-up: fills the shared XLA cache for both sides' programs
        _ask(trees[side], questions[0])
    asks: dict[str, list[dict]] = {"before": [], "after": []}
    for q in questions:
        for side in ORDER[:2] if len(asks["before"]) % 2 == 0 else ORDER[2:]:
            asks[side].append(_ask(trees[side], q))
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for side in ORDER:  # each side twice, alternating (the XLA cache is warm for both after their first run)
        runs[side].append(_eval(trees[side], args.data, args.eval_questions))
    evals = {side: _mean_eval(runs[side]) for side in runs}
    same_asks = [a["answer"] == b["answer"] and a["drafts"] == b["drafts"] for a, b in zip(*asks.values())]
    reference = runs["before"][0]["predictions"]
    diff = sorted({k for r in runs["before"] + runs["after"] for k, v in r["predictions"].items() if reference[k] != v})

    def mean(side: str, key: str) -> float:
        return statistics.mean(a[key] for a in asks[side])

    eval_rate = {s: args.eval_questions * 2 / sum(evals[s]["wall_s"].values()) for s in evals}
    result = {
        **run_header(),
        "before_commit": commit_of(trees["before"]),
        "ask": {
            "questions": questions,
            "total_s_mean": {s: mean(s, "total_s") for s in asks},
            "process_s_mean": {s: mean(s, "process_s") for s in asks},
            "after_over_before": mean("after", "total_s") / mean("before", "total_s"),
            "identical_answers_and_drafts": all(same_asks),
            "runs": asks,
        },
        "eval": {
            "questions": args.eval_questions,
            "method_answers_per_s": eval_rate,
            "after_over_before_throughput": eval_rate["after"] / eval_rate["before"],
            "latency_s_mean": {s: evals[s]["latency_s_mean"] for s in evals},
            "compile_s": {s: evals[s]["compile_s"] for s in evals},
            "runs_per_side": 2,
            "accuracy": {s: evals[s]["accuracy"] for s in evals},
            "process_s": {s: evals[s]["process_s"] for s in evals},
            "differing_predictions": diff,
        },
    }
    print(json.dumps({k: result[k] for k in ("ask", "eval")}, indent=1, default=str)[:3000])
    if args.out:
        write_results(args.out, result)
    return 0 if all(same_asks) and not diff else 1


if __name__ == "__main__":
    raise SystemExit(main())
