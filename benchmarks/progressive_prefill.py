"""Progressive prefill: time to the first draft token with and without it, same questions, one run.

Serving path (``Service.rag`` on the drafter and verifier engines, prefix cache on, BARS backpressure on), the
reranker a separate copy of the drafter (as ``specrag serve`` builds it) scoring each question's own passages
(reranked to the top ``n_docs``) in groups with the early-termination rule. Each question runs once without
and once with ``progressive_prefill`` (alternating which goes first), every run from a cold prefix cache, after
one warm-up question in both modes (not counted). Reported per run: time to the first draft token, total
latency, rerank groups scored, whether the trigger fired and the final set was the prefilled one, the drafter
engine's prefix-cache hit tokens for the drafting request, plus measured step costs (seconds per rerank group,
drafting's own prefill) to explain the result.

    python benchmarks/progressive_prefill.py --limit 6 --out benchmarks/results/progressive_prefill.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import loadavg, run_header, write_results
from specrag_jax.evaluation.run import load_questions
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.clustering import clustered_subsets
from specrag_jax.pipeline.factory import build_reranker, pool_pages, reranker_pages
from specrag_jax.pipeline.specrag import RAGConfig
from specrag_jax.retrieval import Embedder
from specrag_jax.retrieval.corpus import docs_from_context
from specrag_jax.serving.service import ServeConfig, Service
from specrag_jax.xla_cache import enable_xla_cache


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _drafting_requests(svc: Service) -> list:
    """Record the drafter engine's drafting requests (``submit_phases``) of the next call."""
    eng, seen = svc.engines["drafter"], []
    submit = type(eng).submit_phases

    def spy(*a, **kw):
        seen.append(submit(eng, *a, **kw))
        return seen[-1]

    eng.submit_phases = spy
    return seen


class TimedScorer:
    """The reranker, timing every group it scores (the overlapped groups are the ones after the trigger)."""

    def __init__(self, scorer) -> None:
        self.scorer, self.group_s = scorer, []

    def score(self, question, docs):
        t = time.perf_counter()
        out = self.scorer.score(question, docs)
        self.group_s.append(time.perf_counter() - t)
        return out


def run_one(svc: Service, row: dict, progressive: int, method: str, max_passages: int) -> dict:
    for eng in svc.unique_engines.values():
        eng.reset_prefix_cache()
    seen = _drafting_requests(svc)
    timed = svc.reranker(svc.config.rag.rerank).scorer
    timed.group_s.clear()
    hits0 = svc.engines["drafter"].stats()["prefix_hit_tokens"]
    t = time.perf_counter()
    try:
        ans = svc.rag(
            row["question"],
            docs_from_context(row["context"][:max_passages]),
            method,
            RequestContext(timeout=600),
            progressive_prefill=progressive,
        )
    finally:
        del svc.engines["drafter"].submit_phases
    wall = time.perf_counter() - t
    tr = ans.trace
    prog = tr.get("progressive", {})
    req = seen[0] if seen else None
    rr = tr.get("rerank", {})
    launched = prog.get("launch_groups") or [len(timed.group_s)]
    return {
        "question_id": row.get("question_id"),
        "progressive_prefill": progressive,
        "first_draft_token_s": tr.get("first_draft_token_s"),
        "after_rerank_s": tr["first_draft_token_s"] - tr.get("retrieval_s", 0.0) - tr.get("rerank_s", 0.0),
        "group_s": list(timed.group_s),
        "overlapped_groups": len(timed.group_s) - launched[0],
        "total_s": tr.get("total_s"),
        "wall_s": wall,
        "compile_s": tr.get("compile_s", 0.0),
        "rerank_s": tr.get("rerank_s"),
        "groups_scored": rr.get("groups_scored"),
        "groups_total": rr.get("groups_total"),
        "candidates": rr.get("candidates"),
        "seconds_per_group": tr.get("rerank_s", 0) / max(rr.get("groups_scored", 1), 1),
        "triggered": bool(prog.get("launches")),
        "launch_groups": prog.get("launch_groups", []),
        "final_was_prefilled": prog.get("final_was_prefilled", False),
        "cancelled": prog.get("cancelled", 0),
        "prefill_wait_s": tr.get("prefill_wait_s", 0.0),
        "clustering_s": tr.get("clustering_s"),
        "drafter_first_token_s": tr.get("drafter_first_token_s"),
        "drafting_s": tr.get("drafting_s"),
        "drafting_prompt_tokens": None if req is None else sum(len(req.prefix) + len(s) for s in req.suffixes),
        "drafting_cache_hit_tokens": None if req is None else req.cached_tokens,
        "drafter_engine_hit_tokens": svc.engines["drafter"].stats()["prefix_hit_tokens"] - hits0,
        "answer": ans.answer,
        "drafts": [d.text for d in ans.drafts],
        "notes": prog.get("notes", []),
    }


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def _tail_mean(runs: list[dict], like: list[dict]) -> float | None:
    """Mean seconds of the groups each run of ``like`` scored after its trigger, taken from ``runs``."""
    vals = [g for r, ref in zip(runs, like) for g in r["group_s"][len(ref["group_s"]) - ref["overlapped_groups"] :]]
    return statistics.fmean(vals) if vals else None


def summarize(runs: list[dict]) -> dict:
    out = {}
    for p in sorted({r["progressive_prefill"] for r in runs}):
        rows = [r for r in runs if r["progressive_prefill"] == p]
        out["on" if p else "off"] = {
            k: _mean(rows, k)
            for k in (
                "first_draft_token_s",
                "after_rerank_s",
                "total_s",
                "rerank_s",
                "groups_scored",
                "seconds_per_group",
                "prefill_wait_s",
                "clustering_s",
                "drafter_first_token_s",
                "drafting_cache_hit_tokens",
                "drafting_prompt_tokens",
                "compile_s",
            )
        } | {
            "questions": len(rows),
            "triggered": sum(r["triggered"] for r in rows),
            "final_was_prefilled": sum(r["final_was_prefilled"] for r in rows),
        }
    off = {r["question_id"]: r for r in runs if not r["progressive_prefill"]}
    pairs = [(off[r["question_id"]], r) for r in runs if r["progressive_prefill"] and r["question_id"] in off]
    out["same_output"] = sum(a["answer"] == b["answer"] and a["drafts"] == b["drafts"] for a, b in pairs)
    fired = [(a, b) for a, b in pairs if b["triggered"]]
    if fired:
        out["triggered_only"] = {
            "questions": len(fired),
            "first_draft_token_s_off": statistics.fmean(a["first_draft_token_s"] for a, _ in fired),
            "first_draft_token_s_on": statistics.fmean(b["first_draft_token_s"] for _, b in fired),
            "after_rerank_s_off": statistics.fmean(a["after_rerank_s"] for a, _ in fired),
            "after_rerank_s_on": statistics.fmean(b["after_rerank_s"] for _, b in fired),
            # the same groups (those after the trigger) scored alone (off) and overlapped with the prefill (on)
            "overlapped_group_s_off": _tail_mean([a for a, _ in fired], [b for _, b in fired]),
            "overlapped_group_s_on": _tail_mean([b for _, b in fired], [b for _, b in fired]),
            "total_s_off": statistics.fmean(a["total_s"] for a, _ in fired),
            "total_s_on": statistics.fmean(b["total_s"] for _, b in fired),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="../shared/data/retrievalqa_dev.jsonl")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--min-passages", type=int, default=16, help="questions with at least this many passages")
    ap.add_argument("--max-passages", type=int, default=16, help="rerank the first this many of them")
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--verifier", default="gemma3-270m")
    ap.add_argument("--method", default="speculative")
    ap.add_argument("--n-docs", type=int, default=4)
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--progressive", type=int, default=1, help="the trigger (stable groups) of the 'on' runs")
    ap.add_argument("--rerank", default="recompute", choices=["recompute", "kv"])
    ap.add_argument("--max-doc-tokens", type=int, default=160)
    ap.add_argument("--out", default="benchmarks/results/progressive_prefill.json")
    args = ap.parse_args()
    enable_xla_cache()
    rows = [r for r in load_questions(args.data) if len(r.get("context") or []) >= args.min_passages]
    rows = rows[: args.limit + 1]  # the first is the warm-up
    _log(f"{len(rows) - 1} questions (+1 warm-up) with >= {args.min_passages} passages")
    rag = RAGConfig(
        n_docs=args.n_docs,
        m=args.m,
        k=args.k,
        max_doc_tokens=args.max_doc_tokens,
        rerank=args.rerank,
        rerank_group=args.group,
        rerank_patience=args.patience,
    )
    t = time.perf_counter()
    drafter = TextModel.load(args.drafter, max_seq_len=2048, num_pages=1024)
    verifier = TextModel.load(args.verifier, max_seq_len=2048, num_pages=512)
    rerank_model = TextModel.load(args.drafter, max_seq_len=2048, num_pages=pool_pages(1, 2048, reranker_pages(rag)))
    load_s = time.perf_counter() - t
    svc = Service(
        drafter,
        verifier,
        subsets=clustered_subsets(Embedder(drafter)),
        config=ServeConfig(rag=rag),
        reranker=lambda mode: TimedScorer(build_reranker(dataclasses.replace(rag, rerank=mode), rerank_model)),
    )
    svc.start()
    runs, t_all = [], time.perf_counter()
    try:
        for i, row in enumerate(rows):
            order = (0, args.progressive) if i % 2 == 0 else (args.progressive, 0)
            for p in order:
                r = run_one(svc, row, p, args.method, args.max_passages)
                _log(
                    f"q{i} {r['question_id']} progressive={p}: first draft token {r['first_draft_token_s']:.2f} s, "
                    f"total {r['total_s']:.2f} s, groups {r['groups_scored']}/{r['groups_total']}, triggered "
                    f"{r['triggered']} reused {r['final_was_prefilled']}, draft cache hits "
                    f"{r['drafting_cache_hit_tokens']}/{r['drafting_prompt_tokens']}, compile {r['compile_s']:.1f} s, "
                    f"after rerank {r['after_rerank_s']:.2f} s, groups {[round(g, 2) for g in r['group_s']]}"
                )
                if i:
                    runs.append(r)
    finally:
        svc.stop(drain=False)
    payload = {
        **run_header(),
        "drafter": args.drafter,
        "verifier": args.verifier,
        "reranker": args.drafter,
        "method": args.method,
        "config": {
            "n_docs": args.n_docs,
            "m": args.m,
            "k": args.k,
            "rerank": args.rerank,
            "rerank_group": args.group,
            "rerank_patience": args.patience,
            "progressive_prefill": args.progressive,
            "max_doc_tokens": args.max_doc_tokens,
            "min_passages": args.min_passages,
            "max_passages": args.max_passages,
        },
        "load_s": load_s,
        "measured_s": time.perf_counter() - t_all,
        "summary": summarize(runs),
        "runs": runs,
        "loadavg_end": loadavg(),
    }
    path = write_results(args.out, payload)
    _log(f"wrote {path}")


if __name__ == "__main__":
    main()
