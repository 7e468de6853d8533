"""The generic tables of an eval run (a ``specrag eval`` folder): methods, settings, held-out against train."""

from __future__ import annotations

import statistics
from typing import Sequence

from benchmarks.report_source import ReportError, Source, get
from benchmarks.report_text import DASH, fmt, pct, secs, table


def split_breakdown(src: Source, name: str, methods: Sequence[str]) -> dict[str, dict[str, tuple]]:
    """Per method: (n, accuracy, mean latency) on the held-out and train parts of a ``--split all`` run, from its
    predictions (the split depends only on each row's question_id and data_source)."""
    from specrag_jax.evaluation.holdout import split_rows

    res, where = src.json(name), src.shown(name)
    fraction = get(res, "?config/holdout_fraction", where) or 0.3
    preds = src.jsonl(f"{name}/predictions.jsonl")
    questions = list({p["question_id"]: p for p in preds}.values())
    held = {r["question_id"] for r in split_rows(questions, "heldout", fraction)}
    out: dict[str, dict[str, tuple]] = {}
    for m in methods:
        out[m] = {}
        for part, keep in (("heldout", True), ("train", False)):
            rows = [p for p in preds if p["method"] == m and (p["question_id"] in held) == keep]
            if not rows:
                raise ReportError(f"{src.shown(name)}: no {m} predictions on the {part} split")
            acc = sum(bool(p["correct"]) for p in rows) / len(rows)
            out[m][part] = (len(rows), acc, statistics.fmean(p["latency_s"] for p in rows))
    return out


def eval_run_lines(src: Source, name: str) -> list[str]:
    res, where = src.json(name), src.shown(name)
    methods = get(res, "methods", where)
    rows = []
    for m, r in methods.items():
        at = f"{where}: methods/{m}"
        acc_right = get(r, "?cascade/accepted", at)
        cascade = (
            f"{acc_right} accepted ({fmt(get(r, '?cascade/accepted_accuracy', at), pct)} right), "
            f"{get(r, 'cascade/fallback', at)} fell back"
            if acc_right is not None
            else DASH
        )
        paths = get(r, "?router/paths", at)
        rows.append(
            [
                m,
                get(r, "n", at),
                fmt(get(r, "accuracy", at), pct),
                " / ".join(fmt(get(r, f"latency_s/{k}", at), "{:.2f}") for k in ("mean", "median", "p95")),
                fmt(get(r, "?tokens/per_question", at), "{:,.0f}"),
                fmt(get(r, "?speculation/accepted_tokens_per_step", at), "{:.2f}"),
                ", ".join(f"{k} {v}" for k, v in paths.items()) if paths else cascade,
            ]
        )
    header = ("method", "n", "accuracy", "latency mean / median / p95 (s)", "tokens per question",
              "tokens per verifier step", "cascade or route")  # fmt: skip
    lines = table(header, rows)
    config = get(res, "?config", where) or {}
    keys = ("split", "limit", "drafter", "drafter_adapter", "verifier", "n_docs", "m", "k", "selection", "tau_min",
            "clustering", "tree_budget")  # fmt: skip
    shown = [f"{k} {config[k]}" for k in keys if config.get(k) is not None]
    if shown:
        lines += ["", "Settings: " + ", ".join(shown) + "."]
    if config.get("split") == "all":
        parts = split_breakdown(src, name, list(methods))
        body = []
        for m, by in parts.items():
            body.append([m] + [f"{fmt(a, pct)} / {secs(t)} (n={n})" for n, a, t in (by["heldout"], by["train"])])
        lines += ["", *table(("method", "held-out: accuracy / mean latency", "train: accuracy / mean latency"), body)]
    selection = get(res, "?selection", where)
    if selection:
        lines += ["", "Selection alone on the same drafts: " + ", ".join(f"{k} {fmt(v, pct)}" for k, v in
                                                                        selection.items()) + "."]  # fmt: skip
    drafts = get(res, "?drafts", where)
    if drafts:
        lines += [
            "",
            f"Drafts: {get(drafts, 'n', where)}, right {fmt(get(drafts, 'correct', where), pct)}, following the "
            f"format {fmt(get(drafts, '?follows_format', where), pct)}.",
        ]
    return lines
