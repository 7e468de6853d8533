"""Choose the default selection option and the cascade's threshold on the train split (issue 21).

Reads an eval run over ``--split train`` with ``speculative`` (run with ``--no-consensus --tau-min none``, so
every question's drafts are fully scored: both verification passes, ``predictions.jsonl``) and ``standard``. Both
are greedy with the same verifier, so the cascade's fallback answer to a question is exactly the ``standard``
prediction (the lossless path decodes the same tokens): the cascade's accuracy is simulated exactly for every
(selection option, consensus fast path, tau_min), re-scoring the recorded drafts with the library's own
``selection.select`` and ``selection_confidence``.

Candidates: the selection options whose cascade confidence does not use the drafter's own probabilities
(``evidence``, ``evidence+agg`` and their ``+ground`` forms). The shipped drafter was trained on these train
questions, so its confidence is inflated here (drafter_only is reported beside it; held out it was 10.0%,
random_draft's level) and is not a valid calibration signal; the ``rho`` options are reported for comparison. A
drafter trained on ``--split train-fit`` never saw the ``train-calibrate`` questions, so there every option is a
candidate (``--candidates all``). Choice: the highest accuracy; ties: the most answers accepted from drafts (the
cheaper path); ``--smooth W`` ranks by the accuracy averaged over W neighbouring thresholds first (a plateau, not a
one-question spike). ``--tau`` reports a rounded threshold. A run recorded before drafts carried ``grounded`` is
checked here against the data row's passages (whole; drafting reads them cut to 160 tokens).

The default (``rag_config.DEFAULT_SELECTION``, ``DEFAULT_TAU_MIN``) was chosen on train-calibrate:

    python benchmarks/choose_cascade.py --predictions benchmarks/results/eval_calib20_fit/predictions.jsonl \
        --data ../shared/data/retrievalqa_dev.jsonl --candidates all --smooth 2 --tau 0.41 \
        --out benchmarks/results/cascade_choice_ground.json

    python benchmarks/choose_cascade.py --predictions build/eval_train70/predictions.jsonl \
        --data ../shared/data/retrievalqa_dev.jsonl --out benchmarks/results/cascade_choice_train.json --tau 0.5
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results
from specrag_jax.evaluation.run import is_correct
from specrag_jax.pipeline.closed_set import from_row
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import occurs_in_passages
from specrag_jax.pipeline.selection import (
    EVIDENCE_TERMS,
    SELECTIONS,
    ScoreOptions,
    consensus,
    select,
    selection_confidence,
)
from specrag_jax.retrieval.corpus import docs_from_context

CANDIDATES = ("evidence", "evidence+agg", "evidence+ground", "evidence+agg+ground")


def questions(predictions: Path, data: Path, standard_from: Path | None = None) -> list[dict]:
    """Per question: ground truth, standard's correctness, the recorded drafts and the baselines'. ``standard_from``:
    take ``standard`` from another run over the same questions (standard RAG does not depend on the drafter, so a
    new drafter's run needs only ``speculative``)."""
    data_rows = {}
    for line in data.read_text().splitlines():
        row = json.loads(line)
        data_rows[row.get("question_id")] = row
    by_id: dict[str, dict] = {}
    for line in predictions.read_text().splitlines():
        p = json.loads(line)
        by_id.setdefault(p["question_id"], {})[p["method"]] = p
    if standard_from is not None:
        for line in standard_from.read_text().splitlines():
            p = json.loads(line)
            if p["method"] == "standard" and p["question_id"] in by_id:
                by_id[p["question_id"]]["standard"] = p
    rows = []
    for qid, m in by_id.items():
        if "speculative" in m and "standard" in m:
            rows.append(
                {
                    "id": qid,
                    "truth": data_rows[qid]["ground_truth"],
                    "standard": m["standard"]["correct"],
                    "drafts": checked(data_rows[qid], [Draft(**d) for d in m["speculative"]["drafts"]]),
                    "baselines": {k: m[k]["correct"] for k in ("random_draft", "drafter_only") if k in m},
                }
            )
    if not rows:
        raise SystemExit(f"{predictions}: no question has standard and speculative predictions")
    return rows


def checked(row: dict, drafts: list[Draft]) -> list[Draft]:
    """``drafts`` with ``grounded`` set from the row's passages where a run recorded none (runs before the check;
    closed-set labels and rows without ``context`` stay unchecked). The passages are read whole, where drafting
    reads them cut to ``max_doc_tokens`` (160): an answer beyond the cut counts as grounded here."""
    if not row.get("context") or from_row(row) is not None or all(d.grounded is not None for d in drafts):
        return drafts
    docs = {d["id"]: d for d in docs_from_context(row["context"])}
    for d in drafts:
        if d.grounded is None:
            d.grounded = d.parsed and occurs_in_passages(d.answer, [docs[i] for i in d.doc_ids if i in docs])
    return drafts


def picks(rows: list[dict], option: str) -> list[tuple[bool, float, bool]]:
    """Per question: is the option's pick correct, its cascade confidence, and are the drafts unanimous."""
    out = []
    for q in rows:
        drafts = copy.deepcopy(q["drafts"])
        chosen = select(drafts, option, ScoreOptions())
        out.append(
            (is_correct(chosen.answer, q["truth"]), selection_confidence(chosen, drafts, option), consensus(drafts))
        )
    return out


def cascade(rows: list[dict], chosen: list[tuple[bool, float, bool]], tau: float | None, fast_path: bool) -> dict:
    """The cascade's accuracy and acceptance: a draft answers when unanimous (``fast_path``) or when its
    confidence reaches ``tau`` (None: always); else the standard answer."""
    n = len(rows)
    take = [(fast_path and unanimous) or tau is None or conf >= tau for _, conf, unanimous in chosen]
    ok = [pick if t else q["standard"] for q, (pick, _, _), t in zip(rows, chosen, take)]
    accepted = sum(take)
    return {
        "accuracy": sum(ok) / n,
        "acceptance_rate": accepted / n,
        "accepted_accuracy": sum(o for o, t in zip(ok, take) if t) / accepted if accepted else None,
        "fallback_accuracy": (sum(o for o, t in zip(ok, take) if not t) / (n - accepted) if n > accepted else None),
    }


def smooth(tried: list[dict], window: int) -> None:
    """Add ``smoothed_accuracy``: per (selection, consensus), the mean accuracy over the ``window`` neighbouring
    thresholds on each side (in threshold order, "accept all" first). With a few dozen questions one threshold's
    accuracy can be a one-question spike; a plateau is what should generalise. ``window=0``: the accuracy itself."""
    groups: dict[tuple, list[dict]] = {}
    for t in tried:
        groups.setdefault((t["selection"], t["consensus"]), []).append(t)
    for group in groups.values():
        group.sort(key=lambda t: -1.0 if t["tau_min"] is None else t["tau_min"])
        for i, t in enumerate(group):
            near = group[max(0, i - window) : i + window + 1]
            t["smoothed_accuracy"] = sum(x["accuracy"] for x in near) / len(near)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predictions", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--out", default="benchmarks/results/cascade_choice_train.json")
    ap.add_argument("--standard-from", type=Path, default=None, help="standard's predictions from another run")
    ap.add_argument("--tau", type=float, default=None, help="also report this (rounded) threshold")
    ap.add_argument(
        "--candidates",
        default=",".join(CANDIDATES),
        help=f"selection options the choice may take, comma-separated, or 'all' (default {','.join(CANDIDATES)})",
    )
    ap.add_argument(
        "--smooth",
        type=int,
        default=0,
        help="rank thresholds by the mean accuracy over this many neighbouring thresholds on each side (default 0)",
    )
    args = ap.parse_args()
    candidates = SELECTIONS if args.candidates == "all" else tuple(c for c in args.candidates.split(",") if c)
    unknown = sorted(set(candidates) - set(SELECTIONS))
    if unknown or not candidates:
        raise SystemExit(f"--candidates: unknown or empty {unknown}; use some of {', '.join(SELECTIONS)} or 'all'")
    rows = questions(args.predictions, args.data, args.standard_from)
    n = len(rows)
    tried = []
    picked = {option: picks(rows, option) for option in SELECTIONS}  # each option's replay, once
    for option, chosen in picked.items():
        for fast_path in (False, True):
            for tau in [None] + sorted({c for _, c, _ in chosen}):  # tau = a seen confidence: that one is accepted
                tried.append(
                    {
                        "selection": option,
                        "consensus": fast_path,
                        "tau_min": tau,
                        **cascade(rows, chosen, tau, fast_path),
                    }
                )

    smooth(tried, args.smooth)

    def rank(t: dict) -> tuple:
        return round(t["smoothed_accuracy"], 9), round(t["accuracy"], 9), t["acceptance_rate"], -(t["tau_min"] or 0.0)

    best = max((t for t in tried if t["selection"] in candidates), key=rank)
    summary = {
        "n": n,
        "one_question_points": 100.0 / n,
        "evidence_terms": list(EVIDENCE_TERMS),
        "standard_accuracy": sum(q["standard"] for q in rows) / n,
        "baselines": {k: sum(q["baselines"].get(k, False) for q in rows) / n for k in ("random_draft", "drafter_only")},
        "oracle": sum(any(is_correct(d.answer, q["truth"]) for d in q["drafts"]) for q in rows) / n,
        "selection_alone": {o: cascade(rows, picked[o], None, False)["accuracy"] for o in SELECTIONS},
        "best_per_selection": {o: max((t for t in tried if t["selection"] == o), key=rank) for o in SELECTIONS},
        "candidates": list(candidates),
        "smooth": args.smooth,
        "chosen": best,
    }
    if args.tau is not None:
        summary["chosen_rounded"] = {
            "tau_min": args.tau,
            **cascade(rows, picked[best["selection"]], args.tau, best["consensus"]),
        }
    write_results(args.out, {**run_header(), "predictions": str(args.predictions), **summary, "tried": tried})
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
