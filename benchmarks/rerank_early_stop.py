"""Coarse-to-fine on the pooled dev corpus: BM25 top ``n_coarse`` per question, every candidate scored once by
the reranker, then the early-termination rule replayed on those scores (a lookup scorer) for several
patience values against the full rerank.

Reported: recall of each question's own passages in the top ``n_docs`` for BM25 alone, the full rerank and
each early-stopped rerank; the fraction of fine scoring saved; the fraction of questions whose early-stopped
top ``n_docs`` equals the full rerank's (as a set); reranker seconds per question.

    python benchmarks/rerank_early_stop.py --data ../shared/data/retrievalqa_dev.jsonl --limit 12 \
        --out benchmarks/results/rerank_early_stop.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import loadavg, run_header, write_results
from specrag_jax.evaluation.run import load_questions
from specrag_jax.models.text_model import TextModel
from specrag_jax.rerank.coarse_to_fine import rerank_coarse_to_fine
from specrag_jax.rerank.reranker import Reranker
from specrag_jax.retrieval import LexicalIndex
from specrag_jax.retrieval.pooling import own_passage_recall, own_passages, passage_key, pool_passages
from specrag_jax.xla_cache import enable_xla_cache


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="../shared/data/retrievalqa_dev.jsonl")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--reranker", default="smollm2-135m-instruct")
    ap.add_argument("--n-coarse", type=int, default=50)
    ap.add_argument("--n-docs", type=int, default=10)
    ap.add_argument("--group", type=int, default=10)
    ap.add_argument("--patience", default="1,2,3")
    ap.add_argument("--max-doc-tokens", type=int, default=160)
    ap.add_argument("--out", default="benchmarks/results/rerank_early_stop.json")
    args = ap.parse_args()
    enable_xla_cache()
    all_rows = load_questions(args.data)
    corpus = pool_passages(all_rows)  # every passage of the whole file: each question competes with the rest
    index = LexicalIndex.build(corpus)
    model = TextModel.load(args.reranker, max_seq_len=1024, max_batch=16)
    reranker = Reranker(model, mode="kv", max_doc_tokens=args.max_doc_tokens, cache_docs=0)
    patiences = [int(p) for p in args.patience.split(",") if p]
    per_q = []
    for q, row in enumerate(all_rows[: args.limit]):
        own = own_passages(row)
        cands = [{**corpus[i], "coarse": float(s)} for i, s in index.search(row["question"], args.n_coarse)]
        t = time.perf_counter()
        scores = reranker.score(row["question"], cands)
        fine_s = time.perf_counter() - t
        lookup = {c["id"]: s for c, s in zip(cands, scores)}
        score_fn = lambda _q, docs: [lookup[d["id"]] for d in docs]  # noqa: E731
        keys = lambda docs: [passage_key(d) for d in docs]  # noqa: E731
        full, _ = rerank_coarse_to_fine(row["question"], cands, score_fn, args.n_docs, args.group, math.inf)
        rec = {
            "question_id": row.get("question_id"),
            "fine_s": fine_s,
            "candidates": len(cands),
            "recall_bm25": own_passage_recall(own, keys(cands[: args.n_docs])),
            "recall_full_rerank": own_passage_recall(own, keys(full)),
            "recall_bm25_top_n_coarse": own_passage_recall(own, keys(cands)),
            "early": {},
        }
        for p in patiences:
            top, trace = rerank_coarse_to_fine(row["question"], cands, score_fn, args.n_docs, args.group, p)
            rec["early"][str(p)] = {
                "saved_fraction": trace["saved_fraction"],
                "same_set_as_full": {d["id"] for d in top} == {d["id"] for d in full},
                "recall": own_passage_recall(own, keys(top)),
            }
        per_q.append(rec)
        _write(args, corpus, per_q, reranker, patiences)
        _log(
            f"q{q}: {len(cands)} candidates {fine_s:.1f}s recall bm25 {rec['recall_bm25']} full "
            f"{rec['recall_full_rerank']} "
            + " ".join(
                f"p{p}: saved {v['saved_fraction']:.2f} same {v['same_set_as_full']}" for p, v in rec["early"].items()
            )
        )
    _log(f"wrote {_write(args, corpus, per_q, reranker, patiences)}")


def _write(args: argparse.Namespace, corpus: list, per_q: list[dict], reranker: Reranker, patiences: list[int]):
    """Summarise the questions done so far and write the results file (after every question: a long run keeps
    what it measured)."""
    mean = lambda xs: statistics.fmean([x for x in xs if x is not None])  # noqa: E731
    summary = {
        "questions": len(per_q),
        "corpus_passages": len(corpus),
        "pairs_scored": sum(r["candidates"] for r in per_q),
        "fine_s_per_question": mean(r["fine_s"] for r in per_q),
        "recall_own_passages": {
            "bm25_top_n_docs": mean(r["recall_bm25"] for r in per_q),
            "full_rerank_top_n_docs": mean(r["recall_full_rerank"] for r in per_q),
            "bm25_top_n_coarse (ceiling)": mean(r["recall_bm25_top_n_coarse"] for r in per_q),
        },
        "early_termination": {
            p: {
                "saved_fraction": mean(r["early"][p]["saved_fraction"] for r in per_q),
                "same_set_as_full_fraction": mean(float(r["early"][p]["same_set_as_full"]) for r in per_q),
                "recall": mean(r["early"][p]["recall"] for r in per_q),
            }
            for p in map(str, patiences)
        },
    }
    payload = {
        **run_header(),
        "reranker": args.reranker,
        "n_coarse": args.n_coarse,
        "n_docs": args.n_docs,
        "group": args.group,
        "max_doc_tokens": args.max_doc_tokens,
        "summary": summary,
        "per_question": per_q,
        "reranker_stats": dataclasses.asdict(reranker.stats),
        "loadavg_end": loadavg(),
    }
    return write_results(args.out, payload)


if __name__ == "__main__":
    main()
