"""Are drafts whose answer occurs in their own passages right more often? (issue 21: drafter data and selection)

Reads eval runs' ``predictions.jsonl`` (speculative RAG's drafts, or random_draft's in a drafts-only run: answer and
subset ``doc_ids``) and the data file their questions came from, and counts per run the drafts whose answer occurs
in their own subset's passages (``prompts.occurs_in_passages``, the check ``make-drafter-data --require grounded``
applies to training examples) and how often each kind is right, with the cascade's accepted drafts listed. No model
runs.

    python benchmarks/draft_grounding.py --data ../shared/data/retrievalqa_dev.jsonl \
        --runs benchmarks/results/eval_train70_lexical benchmarks/results/eval_heldout30_lexical

    python benchmarks/draft_grounding.py --data ../shared/data/retrievalqa_dev.jsonl --runs \
        benchmarks/results/eval_calib20_fit benchmarks/results/eval_calib20_synth_drafts \
        --out benchmarks/results/draft_quality_synth.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results
from specrag_jax.evaluation.run import is_correct, load_questions
from specrag_jax.pipeline.prompts import occurs_in_passages
from specrag_jax.retrieval.corpus import docs_from_context


def drafting_predictions(predictions: list[dict]) -> list[dict]:
    """One prediction carrying the drafts per question: speculative's, else random_draft's (a drafts-only run)."""
    by_question: dict[str, dict] = {}
    for p in predictions:
        if p["method"] in ("speculative", "random_draft") and p.get("drafts"):
            if p["method"] == "speculative" or p["question_id"] not in by_question:
                by_question[p["question_id"]] = p
    return list(by_question.values())


def grounding(predictions: list[dict], rows: dict[str, dict]) -> dict:
    """Draft counts and accuracy by whether the answer occurs in the draft's own passages; accepted drafts; the
    oracle (a question some draft answers right) and the draft-only methods' accuracy."""
    counts = {True: [0, 0], False: [0, 0]}  # grounded -> [drafts, right]
    accepted = []
    drafting = drafting_predictions(predictions)
    oracle = 0
    for p in drafting:
        row = rows[p["question_id"]]
        oracle += any(is_correct(d["answer"], row["ground_truth"]) for d in p["drafts"])
        docs = {d["id"]: d for d in docs_from_context(row["context"])}
        for d in p["drafts"]:
            if not d.get("parsed", True):
                continue
            grounded = occurs_in_passages(d["answer"], [docs[i] for i in d["doc_ids"]])
            counts[grounded][0] += 1
            counts[grounded][1] += is_correct(d["answer"], row["ground_truth"])
            if p.get("path") != "fallback" and d["index"] == p.get("chosen_draft"):
                accepted.append({"question_id": p["question_id"], "grounded": grounded, "correct": p["correct"]})
    baselines = {
        m: sum(p["correct"] for p in predictions if p["method"] == m)
        for m in ("random_draft", "drafter_only")
        if any(p["method"] == m for p in predictions)
    }
    drafts = [d for p in drafting for d in p["drafts"]]
    seconds = [p["stages_s"]["drafting_s"] for p in drafting if "drafting_s" in p.get("stages_s", {})]
    # a drafts-only method's latency: retrieval, clustering and drafting without one-time compilation
    draft_latency = [p["latency_s"] for p in predictions if p["method"] == "random_draft" and "latency_s" in p]
    # lossless decoding over the drafts (--methods lossless): tokens a verifier step emits, over every question
    spec = [p["speculation"]["counts"] for p in predictions if p["method"] == "lossless" and p.get("speculation")]
    return {
        "questions": len(drafting),
        "drafts": len(drafts),
        "drafts_parsed": sum(bool(d.get("parsed", True)) for d in drafts),
        # seconds of drafting per question, the median (the first question's one-time compilation aside)
        "drafting_s_median": statistics.median(seconds) if seconds else None,
        "draft_latency_s": statistics.fmean(draft_latency) if draft_latency else None,
        "lossless_tokens_per_step": sum(c["emitted"] for c in spec) / sum(c["steps"] for c in spec) if spec else None,
        "drafts_right": counts[True][1] + counts[False][1],
        "oracle": oracle,
        **{f"{m}_right": n for m, n in baselines.items()},
        "grounded_drafts": counts[True][0],
        "grounded_right": counts[True][1],
        "ungrounded_drafts": counts[False][0],
        "ungrounded_right": counts[False][1],
        "grounded_accuracy": counts[True][1] / max(counts[True][0], 1),
        "ungrounded_accuracy": counts[False][1] / max(counts[False][0], 1),
        "accepted": accepted,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--runs", nargs="+", required=True, help="eval output folders (predictions.jsonl)")
    ap.add_argument("--out", default="benchmarks/results/draft_grounding.json")
    args = ap.parse_args()
    rows = {r["question_id"]: r for r in load_questions(args.data)}
    runs = {}
    for run in args.runs:
        preds = [json.loads(line) for line in (Path(run) / "predictions.jsonl").read_text().splitlines()]
        runs[Path(run).name] = res = grounding(preds, rows)
        print(
            f"{Path(run).name}: {res['questions']} questions, drafts right {res['drafts_right']}, oracle "
            f"{res['oracle']}, random_draft {res.get('random_draft_right')}, drafter_only "
            f"{res.get('drafter_only_right')}; grounded drafts {res['grounded_right']}/{res['grounded_drafts']} "
            f"right, ungrounded {res['ungrounded_right']}/{res['ungrounded_drafts']}"
        )
    print(write_results(args.out, {**run_header(), "data": args.data, "runs": runs}))


if __name__ == "__main__":
    main()
