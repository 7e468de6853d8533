"""Clustering embeddings vs the drafter's own prefill of the same documents, per dev question (steady state).

The question-conditioned embeddings (``Embedder.embed_for_question``: the question once, every retrieved
document as a branch off it, through the drafter) are compared with the prefill that drafting does anyway
(the shared drafter prefix, then every draft's evidence branch), both timed after a warm-up pass over the
same questions, so neither includes compilation.

    python benchmarks/clustering_cost.py --questions 10 --out benchmarks/results/clustering_cost.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results


def main(argv: list[str] | None = None) -> int:
    from specrag_jax.evaluation.run import _row_docs, load_questions
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.pipeline.clustering import clustered_subsets
    from specrag_jax.pipeline.drafting import split_chat_prompt, truncate_docs
    from specrag_jax.pipeline.factory import DEFAULT_DRAFTER
    from specrag_jax.pipeline.prompts import drafter_evidence, drafter_prefix
    from specrag_jax.retrieval import Embedder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/retrievalqa_dev.jsonl"))
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--m", type=int, default=5)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = load_questions(args.data)
    step = max(len(rows) // args.questions, 1)
    rows = rows[::step][: args.questions]
    drafter = TextModel.load(DEFAULT_DRAFTER, max_seq_len=2048, max_batch=args.m)
    embedder = Embedder(drafter)
    subsets_fn = clustered_subsets(embedder)
    cases = []
    for row in rows:
        docs = truncate_docs(drafter, _row_docs(row)[:10], 160, [])
        subsets, _ = subsets_fn(row["question"], docs, args.k, args.m, 0)
        prefix, _ = split_chat_prompt(drafter, drafter_prefix(row["question"]), "")
        suffixes = [
            split_chat_prompt(drafter, drafter_prefix(row["question"]), drafter_evidence([docs[i] for i in s]))[1]
            for s in subsets
        ]
        cases.append((row["question"], docs, prefix, suffixes))
    timings = {"embed_s": [], "prefill_s": []}
    for repeat in range(2):  # the first pass compiles every shape; the second is measured
        for question, docs, prefix, suffixes in cases:
            t0 = time.perf_counter()
            embedder.embed_for_question(question, docs)
            t1 = time.perf_counter()
            res = drafter.generator.generate_branches(prefix, suffixes, max_new_tokens=1)
            t2 = time.perf_counter()
            if repeat:
                timings["embed_s"].append(t1 - t0)
                timings["prefill_s"].append(max(r.prefill_s for r in res) if res else t2 - t1)
    ratio = [e / p for e, p in zip(timings["embed_s"], timings["prefill_s"])]
    result = {
        **run_header(),
        "questions": len(cases),
        "m": args.m,
        "k": args.k,
        "embed_s_median": statistics.median(timings["embed_s"]),
        "drafter_prefill_s_median": statistics.median(timings["prefill_s"]),
        "embed_over_prefill_median": statistics.median(ratio),
        "embed_over_prefill_max": max(ratio),
        "per_question": timings,
    }
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items() if k.endswith(("median", "max"))})
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
