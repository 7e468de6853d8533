"""Progressive prefill (Omnia): prefill the generation prompts of a provisional top set while reranking goes on.

Trigger, a static rule (``RAGConfig.progressive_prefill = N``, 0 = off): after a fine-rerank group that leaves
the top-``n_docs`` set unchanged for exactly ``N`` consecutive groups (``N < rerank_patience``, so before the
stop rule fires) and is not the last group (candidates remain), that provisional set is prefilled on a
worker thread while the next groups are scored: the drafter's shared prefix and the evidence branches of its
subsets (clustered exactly as drafting will, memoised), and the standard-RAG prompt on the verifier (methods
standard and lossless). A later change of the set that becomes stable again triggers again. When reranking
ends (``settle``), in-flight prefills that share a prompt with the final plan are waited for (an engine
request enters the prefix cache when its prefill ends); the others are cancelled. Drafting then finds the
shared prefix and every unchanged branch in the engine's radix prefix cache; a changed branch falls back
through the cache (its longest cached page prefix).

Only an engine with a prefix cache can keep prefilled K/V for a later request (``Generator.start_prefill`` over
a started engine): the server's, and the shared started engines ask and eval run on when it is on
(``pipeline.concurrent_answers``). A pipeline over engines without one refuses it when it answers.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.closed_set import ClosedSet
from specrag_jax.pipeline.drafting import draft_prompts, truncate_docs
from specrag_jax.pipeline.lossless import needs_drafts
from specrag_jax.pipeline.verifier_prompts import answer_prompt

Prompts = frozenset  # of token-id tuples (prefix + suffix of every branch)


def check_progressive(after: int, rerank: str, patience: float) -> None:
    """One-line errors for ``RAGConfig.progressive_prefill``."""
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise SpecRagError(f"progressive_prefill must be a whole number of stable groups >= 0 (got {after!r})")
    if after and rerank == "none":
        raise SpecRagError("progressive prefill overlaps reranking: it needs rerank kv or recompute")
    if after and not after < patience:
        raise SpecRagError(
            f"progressive_prefill ({after} stable groups) must be below rerank_patience "
            f"({patience}) to start before reranking stops"
        )


def require_prefix_cache(after: int, *models: Any) -> None:
    """With progressive prefill on (``after`` > 0), refuse models whose engine keeps no prefix cache."""
    for model in models if after else ():
        cache = getattr(getattr(model.generator, "engine", None), "cache", None)
        if cache is None or not cache.enabled:
            raise SpecRagError(
                f"progressive prefill needs a prefix cache to keep what it prefills; {model.name}'s "
                f"engine has none (started engines keep one: pipeline.concurrent_answers, specrag serve)"
            )


def _doc_key(docs: Sequence[dict]) -> tuple:
    return tuple((d.get("id"), d.get("title"), d.get("text")) for d in docs)


class ProgressivePrefill:
    """One question's progressive prefill: ``on_group`` from the reranker, ``settle`` when it ends, ``close``.

    With ``progressive_prefill`` 0 it only passes ``subsets`` through (memoised) and every other call is a no-op.
    """

    def __init__(self, rag: Any, question: str, methods: Sequence[str], closed: ClosedSet | None = None) -> None:
        self.rag, self.question, self.cfg, self.closed_set = rag, question, rag.config, closed
        self.after = self.cfg.progressive_prefill
        self.draft = any(
            m not in ("standard", "closed_book") and (m != "lossless" or needs_drafts(self.cfg.proposer))
            for m in methods
        )
        self.answer = any(m in ("standard", "lossless", "auto") for m in methods)  # auto: its exact path
        self._memo: dict[tuple, tuple[list[list[int]], dict]] = {}
        self._inflight: list[tuple[str, Prompts, Any]] = []  # (role, prompts, PrefillHandle)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="progressive-prefill") if self.after else None
        self._closed = False
        self._last: tuple | None = None
        self.launched: list[tuple] = []
        self.info: dict[str, Any] = {
            "trigger_stable_groups": self.after,
            "launches": 0,
            "launch_groups": [],
            "cancelled": 0,
            "prefill_cached_tokens": 0,
            "notes": [],
        }
        self._group = 0

    # ------------------------------------------------------------------ the reranker's side
    def on_group(self, top: list[dict], stable: int, last: bool) -> None:
        """After each rerank group: launch a prefill of ``top`` when it has just become stable and more groups
        follow (after the last one there is nothing to overlap: drafting starts at once)."""
        self._group += 1
        if stable != self.after or last or self._pool is None:
            return
        docs = truncate_docs(self.rag.drafter, top, self.cfg.max_doc_tokens, [])
        key = _doc_key(docs)
        if key == self._last:
            return
        self._last = key
        self.launched.append(key)
        self.info["launches"] += 1
        self.info["launch_groups"].append(self._group)
        self._pool.submit(self._launch, docs)

    def subsets(self, question: str, docs: list[dict], k: int, m: int, seed: int) -> tuple[list[list[int]], dict]:
        """The subset sampler, memoised per document list (a provisional set's clustering is not redone)."""
        key = (question, _doc_key(docs), k, m, seed)
        with self._lock:
            hit = self._memo.get(key)
        if hit is None:
            hit = self.rag.subsets_fn(question, docs, k, m, seed)
            with self._lock:
                self._memo[key] = hit
        return [list(s) for s in hit[0]], dict(hit[1])

    # ------------------------------------------------------------------ prompts
    def _answer_prompt(self, docs: list[dict]) -> list[int]:
        tok = self.rag.verifier.tokenizer
        return tok.encode_rendered(answer_prompt(tok, self.question, docs, self.rag.verifier_chat, self.closed_set))

    def _draft_prompts(self, docs: list[dict]) -> tuple[list[int], list[list[int]]]:
        cfg = self.cfg
        subsets, _ = self.subsets(self.question, docs, cfg.k, cfg.m, cfg.seed)
        return draft_prompts(self.rag.drafter, self.question, [[docs[i] for i in s] for s in subsets], self.closed_set)

    def _plan(self, docs: list[dict]):
        """(role, prefix, suffixes) of each prompt group to prefill; the verifier's first (no clustering)."""
        if self.answer:
            yield "verifier", [], [self._answer_prompt(docs)]
        if self.draft:
            yield "drafter", *self._draft_prompts(docs)

    @staticmethod
    def _prompts(prefix: list[int], suffixes: list[list[int]]) -> Prompts:
        return frozenset(tuple(prefix + s) for s in suffixes)

    def _launch(self, docs: list[dict]) -> None:
        try:
            for role, prefix, suffixes in self._plan(docs):
                prompts = self._prompts(prefix, suffixes)
                with self._lock:
                    if self._closed:
                        return
                    self._prune(role, prompts)
                    model = self.rag.drafter if role == "drafter" else self.rag.verifier
                    handle = model.generator.start_prefill(prefix, suffixes)
                    self._inflight.append((role, prompts, handle))
        except Exception as exc:  # an optimisation: drafting still runs (and raises what is really wrong)
            self.info["notes"].append(f"progressive prefill not started: {exc}")

    def _prune(self, role: str, needed: Prompts) -> None:
        """Cancel in-flight prefills of ``role`` that share no prompt with ``needed`` (lock held)."""
        keep = []
        for r, prompts, handle in self._inflight:
            if r == role and not prompts & needed:
                handle.cancel()
                self.info["cancelled"] += 1
            else:
                keep.append((r, prompts, handle))
        self._inflight = keep

    # ------------------------------------------------------------------ the end of reranking
    def settle(self, docs: list[dict], trace: dict) -> dict[str, Any]:
        """Reranking is over and ``docs`` are final: cancel stale prefills, wait for the useful ones; records
        ``progressive`` and ``prefill_wait_s`` in ``trace``."""
        if not self.after:
            return {}
        t = time.perf_counter()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        key = _doc_key(docs)
        plan = list(self._plan(docs)) if self._inflight else []
        with self._lock:
            for role, prefix, suffixes in plan:
                self._prune(role, self._prompts(prefix, suffixes))
            waiting, self._inflight = self._inflight, []
        for _, _, handle in waiting:
            try:
                handle.wait()
            except SpecRagError as exc:  # cancelled / timed out / failed: drafting goes on (or raises it)
                self.info["notes"].append(f"progressive prefill did not finish: {exc}")
            self.info["prefill_cached_tokens"] += handle.cached_tokens
        self.info.update(final_was_prefilled=key in self.launched, settle_s=time.perf_counter() - t)
        trace.update(progressive=self.info, prefill_wait_s=self.info["settle_s"])
        return self.info

    def __enter__(self) -> "ProgressivePrefill":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel whatever is still in flight (an error or cancellation before ``settle``); idempotent."""
        with self._lock:
            self._closed = True
            for _, _, handle in self._inflight:
                handle.cancel()
            self._inflight = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:  # a launch that was submitting while we closed
            for _, _, handle in self._inflight:
                handle.cancel()
            self._inflight = []
