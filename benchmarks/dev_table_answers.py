"""The dev table's answers before and after a refactor: ``specrag eval`` over every dev question in two checkouts,
predictions compared one by one (answer, chosen draft, every draft), both runs one after the other.

    python benchmarks/dev_table_answers.py --before ../before --methods standard,speculative \
        --flags "--selection rho --tau-min none" --out benchmarks/results/dev_table_answers.json

Greedy decoding makes the answers a function of the code alone, so a difference is a changed computation (timings
are reported but not compared: the machine may be busy). Exit status 1 when any prediction differs. Each side
takes about 85 minutes on a 2-core CPU; ``--keep DIR`` keeps each side's eval folder (``DIR/before``,
``DIR/after``) and reuses one already there, so the two sides can run in different sessions.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import run_header, write_results
from benchmarks.one_core import DEV, ROOT, commit_of, prediction_table, run_cli


def predictions(
    tree: Path, data: str, methods: str, flags: list[str], keep: Path | None = None
) -> tuple[dict, dict, float | None]:
    """(method/question -> [answer, chosen draft, drafts...], results.json's methods, process seconds) of one eval
    (``keep``: its folder, reused when it holds a finished run; the seconds are then None)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = keep or Path(tmp)
        wall = None
        if not (out / "results.json").exists():
            _, wall = run_cli(tree, ["eval", "--data", data, "--methods", methods, "--out", str(out), "-q", *flags])
        results = json.loads((out / "results.json").read_text())
        preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines() if line]
    return prediction_table(preds), results["methods"], wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="a checkout of the commit before the refactor")
    p.add_argument("--data", default=str(DEV))
    p.add_argument("--methods", default="standard,speculative")
    p.add_argument("--flags", default="", help="extra `specrag eval` flags, one string, given to both sides")
    p.add_argument("--keep", default=None, help="keep (and reuse) each side's eval folder under this directory")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    trees = {"before": Path(args.before).resolve(), "after": ROOT}
    flags = shlex.split(args.flags)
    keep = {side: Path(args.keep).resolve() / side if args.keep else None for side in trees}
    runs = {side: predictions(tree, args.data, args.methods, flags, keep[side]) for side, tree in trees.items()}
    before, after = runs["before"][0], runs["after"][0]
    differing = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    per_method: dict[str, dict] = {}
    for key in before:
        method = key.split("/")[0]
        row = per_method.setdefault(method, {"questions": 0, "identical": 0})
        row["questions"] += 1
        row["identical"] += key not in differing
    for method, row in per_method.items():
        row["accuracy"] = {side: runs[side][1][method]["accuracy"] for side in runs}
        row["latency_s_mean"] = {side: runs[side][1][method]["latency_s"]["mean"] for side in runs}
    result = {
        **run_header(),
        "before_commit": commit_of(trees["before"]),
        "data": args.data,
        "eval_flags": flags,
        "methods": per_method,
        "process_s": {side: runs[side][2] for side in runs},
        "differing_predictions": {k: {"before": before.get(k), "after": after.get(k)} for k in differing},
        "identical": not differing,
    }
    print(json.dumps({k: result[k] for k in ("methods", "process_s", "identical")}, indent=1))
    if args.out:
        write_results(args.out, result)
    return 0 if not differing else 1


if __name__ == "__main__":
    raise SystemExit(main())
