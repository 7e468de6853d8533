"""Clusterings compared on the train split under the shipped cascade (issues 21, 22): which vectors k-means groups.

Each ``NAME=PREDICTIONS`` is an eval run over ``--split train`` with every draft fully scored (``--tau-min none
--no-consensus``) under one ``--clustering``; ``--standard`` names the run whose ``standard`` predictions are the
cascade's fallback answers (greedy, same verifier: the lossless fallback decodes the same tokens). For each
clustering, the cascade is simulated with the shipped selection and threshold (``rag_config``'s defaults) and with
``evidence+agg``, using ``choose_cascade``'s replay of the library's own selection; plain selection, oracle and the
draft baselines beside it, and each run's mean clustering seconds.

    python benchmarks/compare_clustering.py \
        drafter=benchmarks/results/eval_train70_selection/predictions.jsonl \
        lexical=benchmarks/results/eval_train70_lexical/predictions.jsonl \
        --standard benchmarks/results/eval_train70_selection/predictions.jsonl \
        --data ../shared/data/retrievalqa_dev.jsonl --out benchmarks/results/clustering_train.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.choose_cascade import cascade, picks, questions
from benchmarks.common import run_header, write_results
from specrag_jax.evaluation.run import is_correct
from specrag_jax.pipeline.rag_config import DEFAULT_CONSENSUS, DEFAULT_SELECTION, DEFAULT_TAU_MIN
from specrag_jax.pipeline.selection import SELECTIONS


def with_standard(predictions: Path, standard: Path, tmp: Path) -> Path:
    """``predictions`` without its own standard rows, plus ``standard``'s."""
    rows = [line for line in predictions.read_text().splitlines() if json.loads(line)["method"] != "standard"]
    rows += [line for line in standard.read_text().splitlines() if json.loads(line)["method"] == "standard"]
    tmp.write_text("\n".join(rows) + "\n")
    return tmp


def clustering_seconds(predictions: Path) -> float:
    """Mean clustering seconds of the run's speculative answers."""
    spec = [json.loads(line) for line in predictions.read_text().splitlines()]
    return statistics.fmean(p["stages_s"]["clustering_s"] for p in spec if p["method"] == "speculative")


def summary(rows: list[dict]) -> dict:
    """Accuracy of the cascade (shipped defaults and evidence+agg), plain selection, oracle and baselines."""
    n = len(rows)
    return {
        "n": n,
        "standard": sum(q["standard"] for q in rows) / n,
        "oracle": sum(any(is_correct(d.answer, q["truth"]) for d in q["drafts"]) for q in rows) / n,
        "baselines": {k: sum(q["baselines"].get(k, False) for q in rows) / n for k in ("random_draft", "drafter_only")},
        "selection_alone": {o: cascade(rows, picks(rows, o), None, False)["accuracy"] for o in SELECTIONS},
        "cascade_default": cascade(rows, picks(rows, DEFAULT_SELECTION), DEFAULT_TAU_MIN, DEFAULT_CONSENSUS),
        "cascade_evidence_agg": cascade(rows, picks(rows, "evidence+agg"), DEFAULT_TAU_MIN, DEFAULT_CONSENSUS),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="NAME=PREDICTIONS (an eval run's predictions.jsonl)")
    ap.add_argument("--standard", required=True, type=Path, help="predictions.jsonl whose standard rows are used")
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--out", default="benchmarks/results/clustering_train.json")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.runs:
            name, _, path = run.partition("=")
            merged = with_standard(Path(path), args.standard, Path(tmp) / f"{name}.jsonl")
            results[name] = {**summary(questions(merged, args.data)), "clustering_s": clustering_seconds(Path(path))}
    payload = {
        **run_header(),
        "cascade": {"selection": DEFAULT_SELECTION, "tau_min": DEFAULT_TAU_MIN, "consensus": DEFAULT_CONSENSUS},
        "one_question_points": 100.0 / next(iter(results.values()))["n"],
        "clusterings": results,
    }
    write_results(args.out, payload)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
