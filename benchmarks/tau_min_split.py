"""The tau_min fallback (speculative -> standard RAG below a confidence floor), chosen on one split, measured on
another.

Reads an eval's ``predictions.jsonl`` (``specrag eval --out DIR`` with both ``speculative`` and ``standard``).
Both methods are greedy with the same verifier and prompts, so the fallback's answer to a question is exactly
the ``standard`` prediction: the fallback method is simulated exactly in answers, and its latency is the
speculative latency plus, for the questions that fall back, the standard latency (what the pipeline does:
verify, then generate the standard answer). Questions answered by consensus never fall back (the pipeline
skips verification there, so no confidence exists). tau_min is the value on the tuning split with the best
accuracy (ties: the fewest fallbacks); the other split reports it.

    python benchmarks/tau_min_split.py --predictions benchmarks/results/eval_dev100_qwen/predictions.jsonl \
        --tune 50 --out benchmarks/results/tau_min_split.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results


def questions(path: Path) -> list[dict]:
    """One record per question, in file order: the speculative and standard predictions side by side."""
    by_id: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        p = json.loads(line)
        if p["method"] in ("speculative", "standard"):
            by_id.setdefault(p["question_id"], {})[p["method"]] = p
    rows = [q for q in by_id.values() if {"speculative", "standard"} <= set(q)]
    if not rows:
        raise SystemExit(f"{path}: no question has both speculative and standard predictions")
    return rows


def apply(rows: list[dict], tau: float | None) -> dict:
    """Accuracy, latency and fallback count of speculative-with-fallback at ``tau`` (None: never falls back)."""
    correct, latency, fallbacks = [], [], 0
    for q in rows:
        spec, std = q["speculative"], q["standard"]
        conf = spec.get("confidence")
        falls = tau is not None and conf is not None and not spec.get("consensus") and conf < tau
        fallbacks += falls
        correct.append(std["correct"] if falls else spec["correct"])
        latency.append(spec["latency_s"] + (std["latency_s"] if falls else 0.0))
    return {
        "n": len(rows),
        "accuracy": sum(correct) / len(rows),
        "latency_mean_s": statistics.fmean(latency),
        "latency_median_s": statistics.median(latency),
        "fallbacks": fallbacks,
    }


def choose_tau(rows: list[dict]) -> float | None:
    """The confidence floor with the best accuracy on ``rows`` (ties: fewer fallbacks, i.e. the lower floor)."""
    confs = sorted({q["speculative"]["confidence"] for q in rows if q["speculative"].get("confidence") is not None})
    candidates = [None] + [c + 1e-9 for c in confs]  # "just above" each seen value: that question falls back
    return max(candidates, key=lambda t: (apply(rows, t)["accuracy"], -apply(rows, t)["fallbacks"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictions", required=True)
    ap.add_argument("--tune", type=int, default=50, help="the first N questions choose tau_min; the rest measure it")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = questions(Path(args.predictions))
    tune, test = rows[: args.tune], rows[args.tune :]
    tau = choose_tau(tune)
    result = {
        **run_header(),
        "predictions": args.predictions,
        "tau_min": tau,
        "tune": {"questions": len(tune), "with_fallback": apply(tune, tau), "speculative": apply(tune, None)},
        "test": {
            "questions": len(test),
            "with_fallback": apply(test, tau),
            "speculative": apply(test, None),
            "standard": {
                "accuracy": sum(q["standard"]["correct"] for q in test) / max(len(test), 1),
                "latency_mean_s": statistics.fmean(q["standard"]["latency_s"] for q in test) if test else 0.0,
            },
        },
        "sources": {
            "tune": sorted({q["standard"]["data_source"] for q in tune}),
            "test": sorted({q["standard"]["data_source"] for q in test}),
        },
    }
    print(json.dumps({k: result[k] for k in ("tau_min", "tune", "test")}, indent=1))
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
