"""`specrag eval`: accuracy, latency and tokens of every method on a RetrievalQA-format JSON-lines file.

Accuracy is the usual PopQA/TriviaQA metric (Self-RAG, Speculative RAG): a ground-truth string occurs in the
answer, case-insensitively. The answer is what the method returns (first line, after stop strings).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.specrag import METHODS, SpecRAG
from specrag_jax.retrieval import docs_from_context
from specrag_jax.retrieval.corpus import iter_json_lines

TOKEN_KEYS = ("drafter_prefill_tokens", "drafter_decode_tokens", "verifier_prefix_tokens", "verifier_tree_tokens",
              "verifier_prefill_tokens", "verifier_decode_tokens")


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


def evaluate(rag: SpecRAG, rows: list[dict], methods: Sequence[str], progress: bool = True) -> dict[str, Any]:
    """Run every method on every row; returns the public JSON shape (without ``config``)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SpecRagError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    from tqdm import tqdm

    out: dict[str, Any] = {"methods": {}, "predictions": []}
    for method in methods:
        correct, latencies, by_source = [], [], {}
        tokens = {k: 0 for k in TOKEN_KEYS}
        for row in tqdm(rows, desc=method, disable=not progress, unit="q"):
            docs = docs_from_context(row.get("context") or []) if row.get("context") else None
            t = time.perf_counter()
            result = rag.answer(row["question"], docs, method)
            latencies.append(time.perf_counter() - t)
            ok = is_correct(result.answer, row["ground_truth"])
            correct.append(ok)
            by_source.setdefault(row.get("data_source", "unknown"), []).append(ok)
            for k in TOKEN_KEYS:
                tokens[k] += int(result.trace.get(k, 0))
            out["predictions"].append({"method": method, "question_id": row.get("question_id"),
                                       "answer": result.answer, "correct": ok})
        out["methods"][method] = {
            "n": len(rows),
            "accuracy": sum(correct) / len(correct),
            "by_source": {s: sum(v) / len(v) for s, v in sorted(by_source.items())},
            "latency_s": _latency(latencies),
            "tokens": {**tokens, "total": sum(tokens.values()), "per_question": sum(tokens.values()) / len(rows)},
        }
    return out


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
