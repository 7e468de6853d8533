"""The cascade with and without the early fallback, in one run on the same questions (issue 21).

The cascade's support can never exceed the share of drafts that agree on an answer, so when no answer is shared
by tau_min x m drafts the fallback is certain before verification (``selection.certain_fallback``); by default the
pipeline then skips the verification pass. This answers every question with standard RAG, the cascade with the
early fallback (the default) and the cascade without it (``--no-early-fallback``), one question at a time with the
two cascades alternating (so machine drift hits both), checks that both cascades give the same answers and paths,
and reports mean latency and stage seconds of each, their ratios to standard RAG, and how many questions skipped
verification.

    python benchmarks/early_fallback.py --data ../shared/data/retrievalqa_dev.jsonl --split heldout --limit 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results
from specrag_jax.evaluation.holdout import split_rows
from specrag_jax.evaluation.run import evaluate, load_questions
from specrag_jax.pipeline.factory import build_specrag
from specrag_jax.pipeline.specrag import RAGConfig
from specrag_jax.xla_cache import enable_xla_cache

SIDES = {"early": True, "full": False}  # early_fallback on (the default) / off


def summary(preds: list[dict]) -> dict:
    """Accuracy, mean latency and mean stage seconds of one method's predictions."""
    stages = sorted({k for p in preds for k in p["stages_s"]})
    return {
        "n": len(preds),
        "accuracy": sum(p["correct"] for p in preds) / len(preds),
        "latency_s": statistics.fmean(p["latency_s"] for p in preds),
        "stages_s": {k: statistics.fmean(p["stages_s"].get(k, 0.0) for p in preds) for k in stages},
        "paths": dict(sorted(Counter(str(p["path"]) for p in preds).items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1, help="questions answered (and discarded) first: compilation")
    ap.add_argument("--out", default="benchmarks/results/early_fallback.json")
    args = ap.parse_args()
    enable_xla_cache()
    rows = split_rows(load_questions(args.data), args.split, 0.3)
    warm, rows = rows[: args.warmup], rows[args.warmup : args.warmup + args.limit]
    rag = build_specrag(config=RAGConfig())
    for side in SIDES.values():  # both paths compiled before anything is timed
        rag.config.early_fallback = side
        evaluate(rag, warm, ["standard", "speculative"], progress=False)
    preds: dict[str, list[dict]] = {"standard": [], "early": [], "full": []}
    for i, row in enumerate(rows):
        for side, on in SIDES.items() if i % 2 == 0 else reversed(SIDES.items()):
            rag.config.early_fallback = on
            methods = ["standard", "speculative"] if side == "early" else ["speculative"]
            for p in evaluate(rag, [row], methods, progress=False)["predictions"]:
                preds["standard" if p["method"] == "standard" else side].append(p)
        e, f = preds["early"][-1], preds["full"][-1]
        print(
            f"{row['question_id']}: {e['path']} early {e['latency_s']:.1f}s full {f['latency_s']:.1f}s "
            f"standard {preds['standard'][-1]['latency_s']:.1f}s",
            flush=True,
        )
    differing = [
        e["question_id"]
        for e, f in zip(preds["early"], preds["full"])
        if (e["answer"], e["path"]) != (f["answer"], f["path"])
    ]
    result = {k: summary(v) for k, v in preds.items()}
    std = result["standard"]["latency_s"]
    out = {
        **run_header(),
        "data": args.data,
        "split": args.split,
        "questions": [r["question_id"] for r in rows],
        "config": {"selection": rag.config.selection, "tau_min": rag.config.tau_min, "m": rag.config.m},
        "methods": result,
        "skipped_verification": sum(
            not {"verification_s", "evidence_verification_s"} & set(p["stages_s"]) for p in preds["early"]
        ),
        "ratio_early_vs_standard": result["early"]["latency_s"] / std,
        "ratio_full_vs_standard": result["full"]["latency_s"] / std,
        "ratio_early_vs_full": result["early"]["latency_s"] / result["full"]["latency_s"],
        "identical_answers": not differing,
        "differing": differing,
    }
    write_results(args.out, out)
    print({k: out[k] for k in ("skipped_verification", "ratio_early_vs_standard", "ratio_full_vs_standard")})
    print(f"identical answers and paths: {not differing}")


if __name__ == "__main__":
    main()
