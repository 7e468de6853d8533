"""Reranker throughput (candidate pairs per second): stored document K/V vs recomputing each document.

One run, one model (default: the default drafter, SmolLM2-135M-Instruct, float32), documents of 160 and 512
tokens (cut by ``max_doc_tokens``) and ~20-token questions. Per document length:
- ``recompute``: every call prefills each candidate's whole prompt (the baseline; best of the token budgets
  given, since packing and padding change its cost);
- ``kv_store``: every call loads each document's prefix K/V from the on-disk store into pool pages
  (``cache_docs=0``: nothing stays in pages between calls), then scores all question parts in one step;
- ``kv_cached``: the same with the in-process LRU warm (a repeated document loads nothing).
Each mode runs once untimed over the same questions (compilation), then once timed. Scores of the three
modes are compared (max abs difference). Writes ``benchmarks/results/rerank_kv.json``.

    python benchmarks/rerank_kv.py [--docs 8] [--lengths 160 512]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import PROMPTS, RESULTS_DIR, run_header, write_results

QUESTIONS = [
    "What were the main effects of the printing press on the spread of books and reading in Europe?",
    "Which evening habits make it harder to fall asleep and to stay asleep through the whole night?",
    "How do slow rivers build wide flood plains and deltas with many channels near the sea?",
    "Why does breaking a problem into smaller parts matter more than syntax when learning to program?",
]


def make_docs(n: int) -> list[dict]:
    """``n`` distinct documents, each far longer than 512 tokens (the reranker cuts them)."""
    docs = []
    for i in range(n):
        paragraphs = [PROMPTS[(i + j) % len(PROMPTS)] for j in range(len(PROMPTS))] * 2
        docs.append({"id": f"doc{i}", "title": f"Document {i}", "text": " ".join(paragraphs)})
    return docs


def timed(reranker, docs: list[dict], questions: list[str]) -> tuple[float, list[list[float]], dict]:
    for q in questions:  # untimed pass: compiles every shape this pass will use
        reranker.score(q, docs)
    before = dict(reranker.stats.seconds)
    t0 = time.perf_counter()
    scores = [reranker.score(q, docs) for q in questions]
    seconds = time.perf_counter() - t0
    stages = {k: round(v - before[k], 4) for k, v in reranker.stats.seconds.items()}
    return seconds, scores, stages


def run_length(model, docs, questions, doc_tokens: int, budgets: list[int], store_dir: Path) -> dict:
    from specrag_jax.rerank.index import build_index
    from specrag_jax.rerank.kv_store import DocKVStore
    from specrag_jax.rerank.reranker import Reranker

    store = DocKVStore(store_dir, model)
    summary = build_index(model, docs, store, max_doc_tokens=doc_tokens, token_budget=2048)
    pairs = len(docs) * len(questions)
    out: dict = {
        "doc_tokens": doc_tokens,
        "prefix_tokens_mean": summary["tokens"] / len(docs),
        "pairs": pairs,
        "index_seconds": summary["seconds"],
        "store_bytes": summary["bytes"],
        "store_bytes_per_prefix_token": round(summary["bytes_per_token"], 1),
    }
    scores = {}
    for budget in budgets:
        r = Reranker(model, mode="recompute", max_doc_tokens=doc_tokens, token_budget=budget)
        seconds, scores[f"recompute_{budget}"], stages = timed(r, docs, questions)
        out[f"recompute_budget_{budget}"] = {
            "seconds": round(seconds, 3),
            "pairs_per_s": round(pairs / seconds, 3),
            "stage_seconds": stages,
        }
        print(f"{doc_tokens} tokens, recompute (budget {budget}): {pairs / seconds:.2f} pairs/s", flush=True)
    for name, cache_docs in (("kv_store", 0), ("kv_cached", 64)):
        with Reranker(model, store=store, mode="kv", max_doc_tokens=doc_tokens, cache_docs=cache_docs) as r:
            seconds, scores[name], stages = timed(r, docs, questions)
            out[name] = {
                "seconds": round(seconds, 3),
                "pairs_per_s": round(pairs / seconds, 3),
                "stage_seconds": stages,
                "stats": r.stats.as_dict(),
            }
        print(f"{doc_tokens} tokens, {name}: {pairs / seconds:.2f} pairs/s", flush=True)
    best = max((k for k in out if k.startswith("recompute_budget_")), key=lambda k: out[k]["pairs_per_s"])
    out["recompute"] = {"best": best, **out[best]}
    for name in ("kv_store", "kv_cached"):
        out[f"speedup_{name}"] = round(out[name]["pairs_per_s"] / out["recompute"]["pairs_per_s"], 2)
    ref = np.asarray(scores[f"recompute_{budgets[0]}"])
    out["max_abs_score_diff_vs_recompute"] = {k: float(np.max(np.abs(np.asarray(v) - ref))) for k, v in scores.items()}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--docs", type=int, default=8, help="candidates per question")
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--lengths", type=int, nargs="+", default=[160, 512], help="document tokens")
    p.add_argument(
        "--recompute-budgets",
        type=int,
        nargs="+",
        default=[1024, 2048],
        help="token budgets tried for the recompute baseline (its best is the baseline)",
    )
    p.add_argument("--out", default=str(RESULTS_DIR / "rerank_kv.json"))
    args = p.parse_args(argv)
    from specrag_jax.models.text_model import TextModel

    header = run_header()
    t0 = time.perf_counter()
    pages = args.docs * -(-(max(args.lengths) + 128) // 16) + 256
    model = TextModel.load(args.model, num_pages=pages, max_seq_len=1024)
    load_s = time.perf_counter() - t0
    docs, questions = make_docs(args.docs), QUESTIONS[: args.questions]
    q_tokens = [len(model.tokenizer.encode(q)) for q in questions]
    results = {}
    with tempfile.TemporaryDirectory(prefix="rerank_kv_") as tmp:
        for n in args.lengths:
            results[str(n)] = run_length(model, docs, questions, n, args.recompute_budgets, Path(tmp))
    payload = {
        **header,
        "benchmark": "rerank_kv",
        "model": args.model,
        "dtype": model.runner.dtype,
        "model_load_s": round(load_s, 2),
        "candidates_per_question": args.docs,
        "questions": questions,
        "question_tokens": q_tokens,
        "attention_impl": model.runner.attention_impl,
        "prompt_form": "chat" if model.instruct else "plain",
        "results": results,
    }
    path = write_results(args.out, payload)
    for n, r in results.items():
        print(
            f"{n}-token documents: recompute {r['recompute']['pairs_per_s']:.2f} pairs/s, stored K/V "
            f"{r['kv_store']['pairs_per_s']:.2f} ({r['speedup_kv_store']}x), "
            f"cached {r['kv_cached']['pairs_per_s']:.2f} ({r['speedup_kv_cached']}x)"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
