"""Fit the router's calibration (``specrag_jax/pipeline/router_calibration.json``) and judge it on held-out questions.

Inputs are stored results, so the fit needs no model pass:
- ``--predictions``: an eval's ``predictions.jsonl`` that ran ``speculative`` and ``standard`` (the cascade's outcome
  per question: accepted or not, right or not, and whether standard RAG was right); its train-split rows fit the
  acceptance predictor (``route_predictor``) and give the workload averages (answer and draft lengths, tokens per
  step of the fallback, the share of questions verified); ``--results``: the same eval's results.json (tree tokens);
- ``--roofline``: ``benchmarks/roofline.py``'s results (each stage's measured / bound on this CPU);
- ``--ngram``: ``benchmarks/speculative.py``'s results (lossless mode with n-gram proposals: tokens per step);
- ``--answers``: an eval with ``--answer-stop turn`` (``eval_dev100_answers``): the length of an answer to the end
  of turn, what ``ask`` and the API decode (``Workload.turn_answer_tokens``).

The features are computed from the data file's passages as the pipeline reads them (the first ``n_docs``, each
cut to ``max_doc_tokens`` drafter tokens). ``--check`` scores the fitted predictor on another eval's held-out rows.

    python benchmarks/calibrate_router.py --data ../shared/data/retrievalqa_dev.jsonl \\
        --predictions benchmarks/results/eval_dev100_ground/predictions.jsonl \\
        --results benchmarks/results/eval_dev100_ground/results.json \\
        --check benchmarks/results/eval_heldout30_speculative/predictions.jsonl \\
        --out specrag_jax/pipeline/router_calibration.json --report benchmarks/results/router_calibration.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR, portable, run_header, write_results
from specrag_jax.evaluation.holdout import split_rows
from specrag_jax.evaluation.router_report import cascade_outcome
from specrag_jax.evaluation.run import load_questions
from specrag_jax.models.tokenizer.load import load_tokenizer
from specrag_jax.pipeline.drafting import truncate_docs
from specrag_jax.pipeline.factory import DEFAULT_DRAFTER
from specrag_jax.pipeline.rag_config import RAGConfig
from specrag_jax.pipeline.route_predictor import (
    TARGETS,
    AcceptancePredictor,
    calibration,
    loo_log_loss,
    route_features,
)
from specrag_jax.pipeline.router import STAGES, RouterCalibration, Workload
from specrag_jax.retrieval import docs_from_context


def outcomes(path: Path) -> dict[str, dict[str, bool]]:
    """Per question id: the cascade's outcome (``TARGETS``) from an eval that ran speculative and standard."""
    by: dict[str, dict[str, dict]] = {}
    for line in path.read_text().splitlines():
        p = json.loads(line)
        by.setdefault(p["question_id"], {})[p["method"]] = p
    return {
        qid: cascade_outcome(
            m["speculative"]["path"], bool(m["speculative"]["correct"]), bool(m["standard"]["correct"])
        )
        for qid, m in by.items()
        if "speculative" in m and "standard" in m
    }


def features(rows: list[dict], cfg: RAGConfig) -> dict[str, dict[str, float]]:
    """Per question id: ``route_features`` over the passages as the pipeline reads them."""
    model = types.SimpleNamespace(tokenizer=load_tokenizer(DEFAULT_DRAFTER))
    out = {}
    for row in rows:
        docs = truncate_docs(model, docs_from_context(row.get("context") or [])[: cfg.n_docs], cfg.max_doc_tokens, [])
        out[row["question_id"]] = route_features(row["question"], docs)
    return out


def turn_answer_tokens(path: Path, ids: set[str]) -> float:
    """The mean length of answers to the end of turn (tokens, end of turn included) on the ``ids`` rows of an eval
    run with ``--answer-stop turn`` (its one method's ``answer_tokens``)."""
    rows = [p for p in map(json.loads, path.read_text().splitlines()) if p["question_id"] in ids]
    return statistics.fmean(int(p["answer_tokens"]) for p in rows)


def workload(path: Path, results: Path, ngram: Path, answers: Path, ids: set[str]) -> tuple[Workload, dict]:
    """The averages the router cannot know before drafting, from the train rows of an eval, the n-gram run and a
    turn-answer eval (``answers``)."""
    spec = [p for p in map(json.loads, path.read_text().splitlines()) if p["method"] == "speculative"]
    spec = [p for p in spec if p["question_id"] in ids]
    fallback = [p["speculation"]["counts"] for p in spec if p["path"] == "fallback" and p.get("speculation")]
    steps = sum(c["steps"] for c in fallback)
    drafts = [[d["draft_tokens"] for d in p["drafts"]] for p in spec if p["drafts"]]
    verified = [p for p in spec if "verification_s" in p["stages_s"]]
    everything = json.loads(results.read_text())
    res, m = everything["methods"]["speculative"], int(everything["config"]["m"])
    verified_all = round(res["n"] * len(verified) / max(len(spec), 1))  # results.json totals cover every question
    ng = json.loads(ngram.read_text())["answers_workload"]["answers"]["ngram@8"]["speculation"]
    w = Workload(
        answer_tokens=statistics.fmean(c["emitted"] for c in fallback),
        exact_tokens_per_step=float(ng["accepted_tokens_per_step"]),
        exact_proposed_per_step=float(ng["proposed_tokens_per_step"]),
        fallback_tokens_per_step=sum(c["emitted"] for c in fallback) / steps,
        fallback_proposed_per_step=sum(c["proposed"] for c in fallback) / steps,
        draft_tokens=statistics.fmean(t for ds in drafts for t in ds),
        draft_steps=statistics.fmean(max(ds) for ds in drafts),
        verify_tokens_per_draft=res["tokens"]["verifier_tree_tokens"] / max(verified_all * m, 1),
        verify_rate=len(verified) / len(spec),
        turn_answer_tokens=turn_answer_tokens(answers, ids),
    )
    counts = {"questions": len(spec), "fallback_answers": len(fallback), "verified": len(verified)}
    return w, counts


def stage_ratios(path: Path) -> dict[str, dict[str, float]]:
    """Measured / bound per router stage on this CPU (``benchmarks/roofline.py``); 1.0 where unmeasured."""
    methods = json.loads(path.read_text())["methods"]
    spec, lossless = methods["speculative"]["stages"], methods["lossless"]["stages"]
    cpu = {
        "exact": lossless["lossless"]["ratio"],
        "drafting": spec["drafting"]["ratio"],
        "verification": spec["verification"]["ratio"],
        "fallback": spec["fallback"]["ratio"],
    }
    return {"cpu": cpu, "default": {s: 1.0 for s in STAGES}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/retrievalqa_dev.jsonl")
    ap.add_argument("--predictions", default=str(RESULTS_DIR / "eval_dev100_ground" / "predictions.jsonl"))
    ap.add_argument("--results", default=str(RESULTS_DIR / "eval_dev100_ground" / "results.json"))
    ap.add_argument("--roofline", default=str(RESULTS_DIR / "roofline.json"))
    ap.add_argument("--ngram", default=str(RESULTS_DIR / "speculative_qwen.json"))
    ap.add_argument(
        "--answers",
        default=str(RESULTS_DIR / "eval_dev100_answers" / "predictions.jsonl"),
        help="an eval run with --answer-stop turn (the answer length ask and the API decode)",
    )
    ap.add_argument("--check", default=str(RESULTS_DIR / "eval_heldout30_speculative" / "predictions.jsonl"))
    ap.add_argument("--split", default="train", help="the split the predictor is fitted on")
    ap.add_argument(
        "--l2",
        default="0.25,1,4,16,64,256,10000",
        help="L2 penalties of the logistic fits (standardised features); each target takes the one with the least "
        "leave-one-out log loss on the fit split",
    )
    ap.add_argument("--out", default="specrag_jax/pipeline/router_calibration.json")
    ap.add_argument("--report", default=str(RESULTS_DIR / "router_calibration.json"))
    args = ap.parse_args()

    rows = load_questions(args.data)
    cfg = RAGConfig()
    fit_ids = {r["question_id"] for r in split_rows(rows, args.split)}
    held_ids = {r["question_id"] for r in split_rows(rows, "heldout")}
    feats = features(rows, cfg)
    seen = outcomes(Path(args.predictions))
    train = sorted(q for q in fit_ids if q in seen)
    labels = {t: [seen[q][t] for q in train] for t in TARGETS}
    grid = [float(v) for v in args.l2.split(",")]
    loo = {t: {str(g): loo_log_loss([feats[q] for q in train], labels[t], g) for g in grid} for t in TARGETS}
    l2 = {t: min(grid, key=lambda g: loo[t][str(g)]) for t in TARGETS}
    predictor = AcceptancePredictor.fit([feats[q] for q in train], labels, l2)
    w, counts = workload(Path(args.predictions), Path(args.results), Path(args.ngram), Path(args.answers), set(train))
    header = run_header()
    source = {
        "command": header["command"],
        "commit": header["git"]["commit"],
        "date": header["timestamp_utc"],
        "split": args.split,
        "questions": len(train),
        "predictions": args.predictions,
        "roofline": args.roofline,
        "ngram": args.ngram,
        "answers": args.answers,
        "l2": l2,
    }
    calib = RouterCalibration(predictor, w, stage_ratios(Path(args.roofline)), source)
    report = {**header, "fit": source, "workload": calib.to_dict()["workload"], "counts": counts}
    report["positives"] = {t: int(sum(labels[t])) for t in TARGETS}
    report["loo_log_loss"] = loo
    checks = {"train (in sample)": (train, seen)}
    held_seen = outcomes(Path(args.check))
    checks["heldout"] = (sorted(q for q in held_ids if q in held_seen), held_seen)
    report["calibration"] = {}
    for name, (ids, out) in checks.items():
        preds = [predictor.predict(feats[q]) for q in ids]
        report["calibration"][name] = {t: calibration([p[t] for p in preds], [out[q][t] for q in ids]) for t in TARGETS}
        change = [p["accept_right"] - p["accept_standard_right"] for p in preds]
        report["calibration"][name]["accuracy_change"] = {
            "predicted_mean": statistics.fmean(change),
            "observed": (sum(out[q]["accept_right"] for q in ids) - sum(out[q]["accept_standard_right"] for q in ids))
            / len(ids),
        }
    Path(args.out).write_text(json.dumps(portable(calib.to_dict()), indent=2) + "\n")  # repo-relative paths
    write_results(args.report, report)
    print(json.dumps({"workload": report["workload"], "positives": report["positives"]}, indent=1))
    for name, table in report["calibration"].items():
        for t in TARGETS:
            c = table[t]
            print(
                f"{name:18s} {t:22s} n={c['n']} mean_pred={c['mean_predicted']:.3f} obs={c['observed_rate']:.3f} "
                f"brier={c['brier']:.4f} (rate {c['brier_of_observed_rate']:.4f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
