"""The reranker served by an engine: every (document, question) pair is a scoring request on a shared engine.

Each candidate is a scored tree over a prefix: the prefix is the judging prompt's document part
(``rerank.prompts.JudgePrompt.doc_ids``), the tree is the question part (a chain), and the wanted rows are the
question's last token for every yes and no spelling. The engine's radix prefix cache holds the document
parts' full pages after their first prefill, so a document reranked again (another question, another group)
prefills only its last partial page and the question: its K/V is computed once and reused while it stays in
the cache, alongside every other request's prefixes under the same LRU and admission policy. All candidates
of a call are submitted at once, so the engine batches them (and other requests' work) into its steps.

With a ``DocKVStore`` (``--rerank kv --kv-store``), a document whose full pages the cache does not hold is read
from the store into the cache before its request (``Engine.seed_prefixes``), so a new process prefills only what
no earlier run (``specrag index``, the direct ``kv`` reranker) stored. The store is read, never written, here: the
cache keeps full pages only, and an entry holds the whole document part.

Scores equal ``rerank.reranker.Reranker``'s (same prompt parts, same log-sum-exp over the spellings) within
float tolerance. The reranker of a served drafter or verifier uses that model's engine, so the server loads no
second copy of the model.
"""

from __future__ import annotations

import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.requests import Request, RequestTimeout, Tree
from specrag_jax.models.text_model import TextModel
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.prompts import JudgePrompt, doc_body, text_hash, use_chat


class EngineReranker:
    """``Scorer`` over an engine (see the module docstring); ``bind(ctx)`` gives one request's view."""

    def __init__(
        self,
        model: TextModel,
        engine: Engine,
        *,
        max_doc_tokens: int = 160,
        prompt_form: str = "auto",
        ctx: RequestContext | None = None,
        store: DocKVStore | None = None,
    ) -> None:
        if engine.runner is not model.runner:
            raise SpecRagError(f"the reranker's engine {engine.name!r} does not serve model {model.name!r}")
        self.model, self.engine, self.ctx, self.store = model, engine, ctx, store
        self.max_doc_tokens = max_doc_tokens
        self.prompt = JudgePrompt.for_tokenizer(
            model.tokenizer, chat=use_chat(prompt_form, model.instruct), max_doc_tokens=max_doc_tokens
        )
        self._targets = self.prompt.targets
        self.pairs = 0
        self._read = [0]  # documents read from the store into the engine's cache (shared with the binds)

    def bind(self, ctx: RequestContext) -> "EngineReranker":
        """The same reranker whose engine calls carry ``ctx``'s deadline and cancellation."""
        bound = object.__new__(EngineReranker)
        bound.__dict__.update(self.__dict__, ctx=ctx, pairs=0)
        return bound

    @property
    def loaded(self) -> int:
        """Documents read from the store into the engine's cache by this reranker and every ``bind`` of it."""
        return self._read[0]

    def score(self, question: str, docs: Sequence[dict]) -> list[float]:
        """log P(yes) - log P(no) per document, in order (higher = more relevant)."""
        q = self.prompt.query_ids(question)
        prefixes = [self.prompt.doc_ids(d) for d in docs]
        if not prefixes:
            return []
        limit = self.engine.runner.max_seq_len
        longest = max(len(p) for p in prefixes) + len(q)
        if longest > limit:
            raise SpecRagError(
                f"a judging prompt of {longest} tokens exceeds the reranker's {limit} positions; lower max_doc_tokens"
            )
        if self.store is not None:
            self._seed(docs, prefixes)
        rows = [len(q) - 1] * len(self._targets)
        trees = [
            Tree(list(q), [-1] + list(range(len(q) - 1)), [len(p) + i for i in range(len(q))], rows, self._targets)
            for p in prefixes
        ]
        scores = self.prompt.scores(np.stack(self._run(prefixes, trees)))
        self.pairs += len(prefixes)
        return scores

    def _seed(self, docs: Sequence[dict], prefixes: list[list[int]]) -> None:
        """Read the stored K/V of every document whose full pages are not cached into the engine's cache."""
        store, fingerprint, seeds = self.store, self.prompt.fingerprint(), {}
        for doc, ids in zip(docs, prefixes):
            key = store.key(text_hash(doc_body(doc)), self.max_doc_tokens, fingerprint, ids)
            seeds.setdefault(tuple(ids), lambda key=key: self._load(key))
        self.engine.seed_prefixes(list(seeds.items()))

    def _load(self, key: dict):
        kv = self.store.load(key)
        self._read[0] += kv is not None
        return kv

    def _run(self, prefixes: list[list[int]], trees: list[Tree]) -> list[np.ndarray]:
        """Submit every tree before waiting on any (one engine batch); cancel the rest on a failure."""
        ctx = self.ctx or RequestContext()
        reqs: list[Request] = []
        try:
            for prefix, tree in zip(prefixes, trees):
                reqs.append(ctx.track(lambda t, p=prefix, tr=tree: self.engine.submit_score(p, tr, timeout=t)))
            out = []
            for r in reqs:
                left = None if ctx.deadline is None else max(ctx.deadline - time.perf_counter(), 0.0)
                try:
                    out.append(r.future.result(left))
                except FutureTimeout:
                    raise RequestTimeout("request timed out") from None
            return out
        except BaseException:
            for r in reqs:
                r.cancel()
            raise
        finally:
            for r in reqs:
                ctx.untrack(r)
