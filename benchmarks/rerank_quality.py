"""Reranking quality on the pooled dev corpus (issue 13): accuracy with and without the fine reranker.

Every passage of the dev file is pooled into one corpus (``retrieval.pooling``); each question retrieves from
it. Configurations, all on the same questions and the same loaded models:

- ``bm25``: BM25's top ``n_docs`` as they come (no reranking);
- ``rerank_<role>``: BM25's top ``n_coarse``, the fine reranker (the drafter or the verifier, judging prompt
  of ``rerank.prompts``) in groups of ``rerank_group`` with the default early-termination patience, to the
  top ``n_docs``.

Each configuration runs ``evaluation.run.evaluate`` (the methods share one retrieval and rerank per
question) and reports accuracy, recall of the question's own passages in the documents used, the rerank
report (groups scored, fraction saved) and the mean seconds of each stage. The reranker runs in kv mode with
no on-disk store: each candidate's document K/V is computed once per question and reused across its groups
(stored K/V only changes the rerank stage's time, ``benchmarks/rerank_kv.py`` measures that; the scores
equal recompute's within 1e-4).

    python benchmarks/rerank_quality.py --limit 30 --out benchmarks/results/rerank_quality.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import loadavg, run_header, write_results
from specrag_jax.evaluation.run import evaluate, load_questions
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.clustering import clustered_subsets
from specrag_jax.pipeline.factory import (
    DEFAULT_DRAFTER,
    DEFAULT_VERIFIER,
    RERANK_CACHE_DOCS,
    lexical_search,
    pool_pages,
    reranker_pages,
)
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.rerank.reranker import Reranker
from specrag_jax.retrieval import Embedder, LexicalIndex
from specrag_jax.retrieval.pooling import pool_passages
from specrag_jax.xla_cache import enable_xla_cache

SUMMARY_KEYS = ("n", "accuracy", "latency_s", "stages_s", "recall_own_passages", "rerank")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="../shared/data/retrievalqa_dev.jsonl")
    ap.add_argument("--limit", type=int, default=30, help="the first LIMIT questions of the file")
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--verifier", default=DEFAULT_VERIFIER)
    ap.add_argument("--configs", default="bm25,rerank_drafter", help="bm25, rerank_drafter, rerank_verifier")
    ap.add_argument("--methods", default="standard,speculative,drafter_only")
    ap.add_argument("--n-coarse", type=int, default=50)
    ap.add_argument("--out", default="benchmarks/results/rerank_quality.json")
    args = ap.parse_args()
    enable_xla_cache()
    rows = load_questions(args.data)
    corpus = pool_passages(rows)  # every passage of the whole file, not only the evaluated questions'
    rows = rows[: args.limit]
    configs = [c for c in args.configs.split(",") if c]
    methods = [m for m in args.methods.split(",") if m]
    base = RAGConfig(n_coarse=args.n_coarse)
    extra = reranker_pages(RAGConfig(rerank="kv"))
    roles = {c.removeprefix("rerank_") for c in configs if c != "bm25"}
    t = time.perf_counter()
    drafter = TextModel.load(
        args.drafter,
        max_seq_len=2048,
        max_batch=base.m,
        num_pages=pool_pages(base.m, 2048, extra if "drafter" in roles else 0),
    )
    verifier = TextModel.load(
        args.verifier, max_seq_len=2048, max_batch=2, num_pages=pool_pages(2, 2048, extra if "verifier" in roles else 0)
    )
    load_s = time.perf_counter() - t
    search = lexical_search(LexicalIndex.build(corpus))
    subsets = clustered_subsets(Embedder(drafter))
    results: dict = {}
    payload = {
        **run_header(),
        "data": args.data,
        "questions": len(rows),
        "corpus_passages": len(corpus),
        "drafter": args.drafter,
        "verifier": args.verifier,
        "n_docs": base.n_docs,
        "n_coarse": args.n_coarse,
        "rerank_group": base.rerank_group,
        "rerank_patience": base.rerank_patience,
        "methods": methods,
        "model_load_s": load_s,
        "configs": results,
    }
    for name in configs:
        if name == "bm25":
            config, scorer = RAGConfig(n_coarse=args.n_coarse), None
        else:
            role = name.removeprefix("rerank_")
            model = {"drafter": drafter, "verifier": verifier}[role]
            config = RAGConfig(n_coarse=args.n_coarse, rerank="kv", reranker=role)
            scorer = Reranker(
                model, store=None, mode="kv", max_doc_tokens=config.max_doc_tokens, cache_docs=RERANK_CACHE_DOCS
            )
        rag = SpecRAG(drafter, verifier, subsets=subsets, search=search, config=config, reranker=scorer)
        t = time.perf_counter()
        out = evaluate(rag, rows, methods, progress=True, corpus=corpus)
        wall = time.perf_counter() - t
        results[name] = {
            "wall_s": wall,
            "methods": {m: {k: v[k] for k in SUMMARY_KEYS if k in v} for m, v in out["methods"].items()},
            "predictions": [
                {
                    k: p.get(k)
                    for k in (
                        "method",
                        "question_id",
                        "answer",
                        "correct",
                        "recall_own_passages",
                        "documents",
                        "stages_s",
                    )
                }
                for p in out["predictions"]
            ],
        }
        if scorer is not None:
            results[name]["reranker_stats"] = scorer.stats.as_dict()
            scorer.close()
        _log(
            f"{name}: "
            + ", ".join(
                f"{m} acc {v['accuracy']:.2f} recall {v.get('recall_own_passages')}" for m, v in out["methods"].items()
            )
            + f" ({wall:.0f}s)"
        )
        payload["loadavg_end"] = loadavg()
        write_results(args.out, payload)  # after every configuration: a long run keeps what it measured
    _log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
