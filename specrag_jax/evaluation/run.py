"""`specrag eval`: accuracy, latency and tokens of every method on one evaluation file (any format `datasets` reads).

Accuracy is the usual PopQA/TriviaQA metric (Self-RAG, Speculative RAG): a ground-truth string occurs in the
answer, case-insensitively; closed-set tasks (arc_c, pubhealth) score the exact label (``datasets.metrics``), and
their questions carry their choices into the prompts (``closed_set``). The answer is what the method returns (first
line, after stop strings). Several files at once (Table 1): ``suite.py``.
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any, Sequence

from specrag_jax.compile_time import background_stats
from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.datasets import score_answer
from specrag_jax.evaluation.router_report import cascade_outcome, router_summary
from specrag_jax.host_memory import release_free_heap, status_mib
from specrag_jax.machine_peaks import peaks_once
from specrag_jax.models.deferred_model import ensure_loaded
from specrag_jax.models.executor.step_export import held_programs
from specrag_jax.pipeline.closed_set import from_row
from specrag_jax.pipeline.concurrent_answers import answer_rows
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.lossless import summarize_speculation
from specrag_jax.pipeline.roofline import mean_roofline, model_cost, roofline
from specrag_jax.pipeline.selection import (
    EVIDENCE_TERMS,
    PLAIN_TERMS,
    SELECTIONS,
    ScoreOptions,
    best,
    score_drafts,
    select,
    selection_confidence,
    selection_for,
)
from specrag_jax.pipeline.specrag import METHODS, SpecRAG
from specrag_jax.rerank.coarse_to_fine import summarize_rerank
from specrag_jax.retrieval import docs_from_context
from specrag_jax.retrieval.corpus import iter_json_lines
from specrag_jax.retrieval.pooling import own_passage_recall, own_passages, passage_key

EVAL_HELD_PROGRAMS = 24  # compiled step programs kept per model while an eval runs (``step_export.held_programs``)
TOKEN_KEYS = (
    "drafter_prefill_tokens",
    "drafter_decode_tokens",
    "verifier_prefix_tokens",
    "verifier_tree_tokens",
    "verifier_prefill_tokens",
    "verifier_decode_tokens",
    "evidence_prefix_tokens",
    "evidence_tree_tokens",
)


def load_questions(path: str | Path, limit: int | None = None) -> list[dict]:
    """Rows with ``question``, ``ground_truth`` (list), ``context`` (passages) and ``data_source``."""
    p = Path(path)
    if not p.is_file():
        raise SpecRagError(f"evaluation data file does not exist: {path}")
    rows = []
    for n, row in iter_json_lines(p):
        if not isinstance(row, dict) or "question" not in row or "ground_truth" not in row:
            raise SpecRagError(f"{path}, line {n}: a row needs 'question' and 'ground_truth'")
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise SpecRagError(f"evaluation data file has no questions: {path}")
    return rows


def is_correct(answer: str, ground_truth: Sequence[str]) -> bool:
    """A ground-truth string occurs in the answer (case-insensitive)."""
    low = answer.lower()
    return any(str(g).strip().lower() in low for g in ground_truth if str(g).strip())


def _latency(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "p95": p95}


def _row_docs(row: dict) -> list[dict] | None:
    return docs_from_context(row.get("context") or []) if row.get("context") else None


# answers that spent more of their time in XLA, or beside programs loading ahead on the other core, are left out
ROOFLINE_MAX_COMPILE_SHARE = 0.05


def evaluate(
    rag: SpecRAG,
    rows: list[dict],
    methods: Sequence[str],
    progress: bool = True,
    corpus: Sequence[dict] | None = None,
    concurrency: int = 1,
) -> dict[str, Any]:
    """Run every method on every row; returns the public JSON shape (without ``config``).

    The methods of one question run together (``SpecRAG.answer_methods``): speculative, drafter_only and
    random_draft share one set of drafts, and each method's latency is its own stages' time. ``latency_s``
    excludes one-time XLA compilation (``compile_s`` reports it; ``wall_s`` includes it).
    With ``corpus`` (the documents ``rag.search`` searches) every question is answered from the corpus, not
    its own passages, and each method that reads documents reports ``recall_own_passages``: the mean over
    questions of the fraction of the question's own passages (by text, ``retrieval.pooling``) among the
    ``n_docs`` documents it used (the final, reranked top). With reranking, ``rerank`` is the early-termination
    report (``rerank.coarse_to_fine.summarize_rerank``).
    ``concurrency``: questions answered at once on shared started engines (``pipeline.concurrent_answers``; the
    latencies then include waiting for the other questions' steps).
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise SpecRagError(
            f"unknown method(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(METHODS)}"
        )
    from tqdm import tqdm

    keys = None if corpus is None else {str(d["id"]): passage_key(d) for d in corpus}
    acc: dict[str, dict[str, Any]] = {
        m: {
            "correct": [],
            "latency": [],
            "wall": [],
            "compile": 0.0,
            "by_source": {},
            "tokens": {k: 0 for k in TOKEN_KEYS},
            "stages": {},
            "speculation": [],
            "recall": [],
            "rerank": [],
            "roofline": [],
        }
        for m in methods
    }
    if set(methods) - {"standard", "closed_book"}:
        ensure_loaded(rag.drafter)  # a drafter deferred until its first use: loaded now, not in a question's latency
    costs = (model_cost(rag.drafter), model_cost(rag.verifier))  # the roofline's per-model constants, once
    predictions = []
    verified: list[tuple[list[Draft], dict]] = []  # the speculative drafts and their question row
    paths: list[tuple[str | None, bool]] = []
    routes: list[dict] = []  # method auto's trace "route" per question
    outcomes: list[dict] = []  # the cascade's outcome per question, when speculative and standard both ran

    def answer(pipeline: SpecRAG, row: dict) -> dict:
        closed = from_row(row)  # arc_c / pubhealth: the choices go into the prompts, answers are labels
        loading = background_stats()
        answers = pipeline.answer_methods(
            row["question"], _row_docs(row) if keys is None else None, methods, closed_set=closed
        )
        # programs the step prefetch loaded on its thread while this question ran (they share the CPU with it)
        ahead = (background_stats() - loading).total_s
        for result in answers.values():
            result.trace["background_load_s"] = ahead
        if "speculative" in answers:  # every selection option is scored on the same drafts (outside the latency)
            spec = answers["speculative"]
            scored: dict[str, Any] = {}
            pipeline.verify(
                row["question"],
                spec.docs,
                spec.drafts,
                scored,
                plain="verification_s" not in spec.trace,
                evidence="evidence_verification_s" not in spec.trace,
                closed_set=closed,
            )
            spec.trace[SCORED_AFTER] = scored  # after total_s: not in the latency, not a stage
        return answers

    answered = answer_rows(rag, rows, answer, concurrency)
    released = 0.0
    with held_programs(EVAL_HELD_PROGRAMS):  # a long run's memory stays bounded (``step_export``)
        for row, answers in zip(tqdm(rows, desc="questions", disable=not progress, unit="q"), answered):
            for method, result in answers.items():
                a = acc[method]
                recall = None
                if keys is not None and method != "closed_book":
                    used = [keys.get(str(i), "") for i in result.trace.get("documents", [])]
                    recall = own_passage_recall(own_passages(row), used)
                    if recall is not None:
                        a["recall"].append(recall)
                if "rerank" in result.trace:
                    a["rerank"].append(result.trace["rerank"])
                ok = score_answer(row, result.answer)  # is_correct, or the exact label for closed-set tasks
                total, compile_s = float(result.trace["total_s"]), float(result.trace.get("compile_s", 0.0))
                a["correct"].append(ok)
                a["wall"].append(total)
                a["latency"].append(max(total - compile_s, 0.0))
                a["compile"] += compile_s
                a["by_source"].setdefault(row.get("data_source", "unknown"), []).append(ok)
                for k in TOKEN_KEYS:
                    a["tokens"][k] += int(result.trace.get(k, 0))
                stages = stage_seconds(result.trace)
                ahead = float(result.trace.get("background_load_s", 0.0))
                if compile_s + ahead <= ROOFLINE_MAX_COMPILE_SHARE * total:  # not judged by its bound
                    a["roofline"].append(roofline(result.trace, *costs, method, peaks_once()))
                if "speculation" in result.trace:
                    a["speculation"].append(result.trace["speculation"])
                for k, v in stages.items():
                    a["stages"].setdefault(k, []).append(v)
                predictions.append(
                    {
                        "method": method,
                        "question_id": row.get("question_id"),
                        "data_source": row.get("data_source"),
                        "answer": result.answer,
                        "correct": ok,
                        "latency_s": a["latency"][-1],
                        "compile_s": compile_s,
                        "background_load_s": ahead,
                        "stages_s": stages,
                        "confidence": result.trace.get("confidence"),
                        "consensus": bool(result.trace.get("consensus", False)),
                        "path": result.trace.get("path"),
                        "chosen_draft": result.trace.get("chosen_draft"),
                        "speculation": result.trace.get("speculation"),
                        "verifier_decode_s": result.trace.get("verifier_decode_s"),
                        "answer_tokens": result.trace.get("verifier_decode_tokens"),
                        "answer_cut": result.trace.get("answer_cut"),  # the budget ended it (None: a draft's)
                        "documents": result.trace.get("documents"),
                        "recall_own_passages": recall,
                        "rerank": result.trace.get("rerank"),
                        "drafts": [d.to_dict() for d in result.drafts],
                    }
                )
                if "route" in result.trace:  # method auto: the router's decision and what it predicted
                    predictions[-1]["route"] = result.trace["route"]
                    routes.append(result.trace["route"])
                if method == "speculative":
                    verified.append((result.drafts, row))
                    predictions[-1]["selections"] = selection_picks(result.drafts, from_row(row) is not None)
                    predictions[-1][SCORED_AFTER] = result.trace.get(SCORED_AFTER, {})
                    paths.append((result.trace.get("path"), ok))
            if "speculative" in answers and "standard" in answers:
                spec = answers["speculative"]
                outcomes.append(
                    cascade_outcome(
                        spec.trace.get("path"),
                        score_answer(row, spec.answer),
                        score_answer(row, answers["standard"].answer),
                    )
                )
            released += release_free_heap() or 0.0  # the question's freed host buffers go back to the OS
    out: dict[str, Any] = {"methods": {}, "predictions": predictions}
    for method, a in acc.items():
        tokens = a["tokens"]
        out["methods"][method] = {
            "n": len(rows),
            "accuracy": sum(a["correct"]) / len(a["correct"]),
            "by_source": {s: sum(v) / len(v) for s, v in sorted(a["by_source"].items())},
            "latency_s": _latency(a["latency"]),
            "wall_s": _latency(a["wall"]),
            "compile_s": a["compile"],
            # mean seconds per question of each stage this method ran (compilation included; see compile_s)
            "stages_s": {k: sum(v) / len(rows) for k, v in sorted(a["stages"].items())},
            "tokens": {**tokens, "total": sum(tokens.values()), "per_question": sum(tokens.values()) / len(rows)},
        }
        if method == "lossless" or a["speculation"]:  # lossless, and the speculative method's lossless fallbacks
            out["methods"][method]["speculation"] = summarize_speculation(a["speculation"])
        if keys is not None and method != "closed_book":
            out["methods"][method]["recall_own_passages"] = sum(a["recall"]) / len(a["recall"]) if a["recall"] else None
        if a["rerank"]:
            out["methods"][method]["rerank"] = summarize_rerank(a["rerank"])
        out["methods"][method]["roofline"] = mean_roofline(a["roofline"])
        for stage, row in out["methods"][method]["roofline"].items():  # first method listed names a shared stage
            out.setdefault("roofline", {}).setdefault(stage, {**row, "method": method})
    out["roofline_peaks"] = peaks_once().to_dict()
    out["host_memory"] = {
        "peak_rss_mib": status_mib("VmHWM"),
        "rss_mib": status_mib("VmRSS"),
        "heap_released_mib": round(released, 1),
    }
    if "auto" in out["methods"]:
        out["methods"]["auto"]["router"] = router_summary(routes, outcomes if len(outcomes) == len(routes) else None)
    if verified:
        out["ablations"] = score_ablations(verified)
        out["selection"] = selection_accuracy(verified, [p["selections"] for p in predictions if "selections" in p])
        out["drafts"] = draft_format(verified)
        out["methods"]["speculative"]["cascade"] = cascade_summary(paths)
    return out


def selection_picks(drafts: Sequence[Draft], closed: bool = False) -> dict[str, dict[str, Any]]:
    """Each selection option's answer and cascade confidence on the same (fully scored) drafts, as the pipeline
    runs the option (``closed``: a closed-set question)."""
    out = {}
    for option in SELECTIONS:
        own = copy.deepcopy(list(drafts))
        run = selection_for(option, closed)
        chosen = select(own, run, ScoreOptions())
        out[option] = {
            "answer": chosen.answer,
            "draft": chosen.index,
            "confidence": selection_confidence(chosen, own, run),
        }
    return out


def selection_accuracy(
    verified: Sequence[tuple[Sequence[Draft], dict]], picks: Sequence[dict[str, dict[str, Any]]]
) -> dict[str, float]:
    """Accuracy of every selection option (``selection.SELECTIONS``, default scores) on the same drafts, without
    the cascade's fallback, from each question's ``selection_picks``; ``oracle``: some draft is correct."""
    out = {
        option: sum(score_answer(row, p[option]["answer"]) for (_, row), p in zip(verified, picks)) / len(verified)
        for option in SELECTIONS
    }
    out["oracle"] = oracle(verified)
    return out


def cascade_summary(paths: Sequence[tuple[str | None, bool]]) -> dict[str, Any]:
    """Which path answered (a verified draft, the consensus fast path, or the fallback) and the accuracy of the
    accepted (draft) and fallback answers separately: the cascade's calibration."""
    accepted = [ok for p, ok in paths if p != "fallback"]
    fallback = [ok for p, ok in paths if p == "fallback"]
    return {
        "n": len(paths),
        "accepted": len(accepted),
        "fallback": len(fallback),
        "consensus": sum(p == "consensus" for p, _ in paths),
        "acceptance_rate": len(accepted) / len(paths) if paths else None,
        "accepted_accuracy": sum(accepted) / len(accepted) if accepted else None,
        "fallback_accuracy": sum(fallback) / len(fallback) if fallback else None,
    }


SHORT_RESPONSE_WORDS = 10  # a response of at most this many words is a short answer, as the drafter is asked


def draft_format(verified: Sequence[tuple[Sequence[Draft], dict]]) -> dict[str, float]:
    """How the speculative method's drafts look: shares of all drafts that parsed (a rationale and a response),
    have a short response (<= ``SHORT_RESPONSE_WORDS`` words), follow the format (both) and are correct."""
    drafts = [(d, row) for ds, row in verified for d in ds]
    if not drafts:
        return {"n": 0}
    words = [len(d.answer.split()) for d, _ in drafts]
    short = [w <= SHORT_RESPONSE_WORDS for w in words]
    return {
        "n": len(drafts),
        "parsed": sum(d.parsed for d, _ in drafts) / len(drafts),
        "short_response": sum(short) / len(drafts),
        "follows_format": sum(d.parsed and s for (d, _), s in zip(drafts, short)) / len(drafts),
        "correct": sum(score_answer(row, d.answer) for d, row in drafts) / len(drafts),
        "response_words_mean": statistics.fmean(words),
    }


# the passes eval runs after the speculative answer so that every selection option is scored (their stage
# seconds and token counts; the passes the answer ran itself are in its stages_s)
SCORED_AFTER = "scored_after_answer"
STAGE_KEYS = (
    "retrieval_s",
    "rerank_s",
    "clustering_s",
    "drafting_s",
    "verification_s",
    "evidence_verification_s",
    "generation_s",
)


def stage_seconds(trace: dict[str, Any]) -> dict[str, float]:
    """The per-stage seconds a method's trace recorded (retrieval, rerank, clustering, drafting, verification,
    generation)."""
    return {k: float(trace[k]) for k in STAGE_KEYS if k in trace}


def score_ablations(verified: Sequence[tuple[Sequence[Draft], dict]]) -> dict[str, float]:
    """Accuracy of the speculative selection under every score variant, re-scored from the same drafts.

    Keys are ``"<terms joined by +>/<normalize>"`` (sr = yes_vs_no) plus ``"draft+sc+sr/<normalize>/sr=yes"``;
    ``"oracle"`` is the share of questions where at least one draft is correct (the selection's ceiling).
    """
    variants = [
        ScoreOptions(n, terms)
        for n in ("mean", "sum")
        for terms in (
            ("draft",),
            ("sc",),
            ("sr",),
            ("draft", "sc"),
            ("sc", "sr"),
            ("draft", "sr"),
            PLAIN_TERMS,
            ("ev_sc",),
            ("ev_sr",),
            EVIDENCE_TERMS,
            ("draft", "ev_sc", "ev_sr"),
            ("draft", "ev_sr"),
            ("sr", "ev_sr"),
            ("sc", "sr", "ev_sc", "ev_sr"),
        )
    ]
    variants += [ScoreOptions(n, PLAIN_TERMS, "yes") for n in ("mean", "sum")]
    out: dict[str, float] = {}
    for opt in variants:
        name = "+".join(opt.terms) + "/" + opt.normalize + ("/sr=yes" if opt.sr == "yes" else "")
        hits = 0
        for drafts, row in verified:
            drafts = copy.deepcopy(list(drafts))
            score_drafts(drafts, opt)
            hits += score_answer(row, best(drafts).answer)
        out[name] = hits / len(verified)
    out["oracle"] = oracle(verified)
    return out


def oracle(verified: Sequence[tuple[Sequence[Draft], dict]]) -> float:
    """The share of questions where at least one draft is correct (the selection's ceiling)."""
    return sum(any(score_answer(row, d.answer) for d in ds) for ds, row in verified) / len(verified)


def plot_accuracy_latency(results: dict[str, Any], path: Path) -> Path | None:
    """Accuracy vs mean latency, one point per method (PNG); None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in results["methods"].items():
        ax.scatter(m["latency_s"]["mean"], 100 * m["accuracy"])
        ax.annotate(name, (m["latency_s"]["mean"], 100 * m["accuracy"]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("mean latency per question (s)")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
