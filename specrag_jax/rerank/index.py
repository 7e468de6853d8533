"""Build a document K/V store for a corpus (``specrag index --corpus C --kv-for MODEL``).

Documents go through the reranker's own prefix path (``Reranker.ensure_stored``: batched prefill under a
token budget, then one atomic file per document), so what is stored is exactly what reranking would have
computed. Idempotent and resumable: documents whose entry exists and checks out are skipped, and since every
entry is renamed into place only when complete, an interrupted run leaves whole entries and at most a
temporary file (ignored by readers, removed by the next run once older than an hour).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.reranker import Reranker

STALE_TMP_S = 3600.0


def remove_stale_temporaries(store: DocKVStore, older_than_s: float = STALE_TMP_S) -> int:
    """Delete temporary files left by killed writers (older than ``older_than_s``); returns how many."""
    if not store.directory.is_dir():
        return 0
    now, removed = time.time(), 0
    for p in store.directory.glob(".tmp-*"):
        try:
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def build_index(
    model,
    docs: Sequence[dict],
    store: DocKVStore,
    *,
    max_doc_tokens: int = 160,
    token_budget: int = 2048,
    prompt_form: str = "auto",
    batch_docs: int = 32,
    progress: Callable[[int, int], None] | None = None,
    corpus_name: str = "corpus",
) -> dict:
    """Store every document's prefix K/V; returns a summary (also written as ``<store dir>/<corpus>.json``)."""
    t0 = time.perf_counter()
    remove_stale_temporaries(store)
    reranker = Reranker(
        model,
        store=store,
        mode="kv",
        max_doc_tokens=max_doc_tokens,
        cache_docs=0,
        token_budget=token_budget,
        prompt_form=prompt_form,
    )
    totals = {"skipped": 0, "computed": 0, "tokens": 0, "bytes": 0}
    for start in range(0, len(docs), batch_docs):
        for name, value in reranker.ensure_stored(docs[start : start + batch_docs]).items():
            totals[name] += value
        if progress is not None:
            progress(min(start + batch_docs, len(docs)), len(docs))
    tokens = max(totals["tokens"], 1)
    summary = {
        "corpus": corpus_name,
        "documents": len(docs),
        **totals,
        "max_doc_tokens": max_doc_tokens,
        "prompt_form": prompt_form,
        "chat": reranker.prompt.chat,
        "bytes_per_token": totals["bytes"] / tokens,
        "kv_bytes_per_token": store.bytes_per_token(),
        "seconds": round(time.perf_counter() - t0, 3),
        "stage_seconds": reranker.stats.seconds,
    }
    summary["manifest"] = str(store.write_manifest(f"index-{Path(corpus_name).stem}", summary))
    return summary
