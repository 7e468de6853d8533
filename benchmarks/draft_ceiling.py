"""Where drafting's ceiling is: from `specrag eval --out` folders, per question, is a gold answer in any
passage, in some draft's document subset, and in some draft's answer (the oracle)?

    python benchmarks/draft_ceiling.py --data ../shared/data/retrievalqa_dev.jsonl --split heldout \
        benchmarks/results/eval_heldout30_untuned benchmarks/results/eval_heldout30_tuned60

A draft only sees its subset (k documents), so "in some subset" bounds what a drafter can copy; the oracle
against it says how much of that bound the drafter reaches. Writes benchmarks/results/draft_ceiling.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR, run_header, write_results
from specrag_jax.evaluation.holdout import add_split_options, split_rows
from specrag_jax.evaluation.run import is_correct, load_questions
from specrag_jax.retrieval import doc_text, docs_from_context


def ceiling(eval_dir: Path, rows: dict[str, dict]) -> dict:
    """Counts over the speculative method's questions in ``eval_dir/predictions.jsonl``."""
    preds = [json.loads(line) for line in (eval_dir / "predictions.jsonl").read_text().splitlines() if line]
    preds = [p for p in preds if p["method"] == "speculative"]
    out = {
        "questions": len(preds),
        "answer_in_any_passage": 0,
        "answer_in_some_subset": 0,
        "oracle": 0,
        "oracle_where_in_subset": 0,
    }
    for p in preds:
        row = rows[p["question_id"]]
        docs = {str(d.get("id")): d for d in docs_from_context(row["context"])}
        truth = row["ground_truth"]
        subsets = [[docs[i] for i in d["doc_ids"] if i in docs] for d in p["drafts"]]
        in_subset = any(is_correct(doc_text(doc), truth) for subset in subsets for doc in subset)
        hit = any(is_correct(d["answer"], truth) for d in p["drafts"])
        out["answer_in_any_passage"] += any(is_correct(doc_text(d), truth) for d in docs.values())
        out["answer_in_some_subset"] += in_subset
        out["oracle"] += hit
        out["oracle_where_in_subset"] += hit and in_subset
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    add_split_options(ap)
    ap.add_argument("eval_dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "draft_ceiling.json")
    args = ap.parse_args()
    rows = {r["question_id"]: r for r in split_rows(load_questions(args.data), args.split, args.holdout_fraction)}
    results = {str(d): ceiling(d, rows) for d in args.eval_dirs}
    write_results(args.out, {**run_header(), "data": args.data, "split": args.split, "results": results})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
