"""A decoder reranker: score = log P(yes) - log P(no) after ``[instruction + document][question + prompt]``.

Mode ``recompute`` (the baseline) runs every candidate's whole prompt, document included, on every call.
Mode ``kv`` treats each document part as a cached prefix: its pages come from an in-process LRU of recently
used documents (a second query on a document loads nothing), else from the ``DocKVStore`` (scattered into
free pool pages with ``kv_transfer``), else from a batched prefill (then stored). All candidates' question
parts are then scored as throw-away chunks after their documents' pages, packed into as few steps as the
token budget allows (one, for 50 candidates of ~30 tokens). Both modes feed the model the same token ids,
so their scores agree to float rounding. Every page taken is released on return or error; LRU entries are
evicted (oldest first) when the pool runs short, and a group that still does not fit is split.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import warnings
from typing import Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels.page_pool import PoolExhausted, pages_needed
from specrag_jax.models.executor.kv_transfer import runner_read_kv, runner_write_kv
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.prompts import JudgePrompt, doc_body, text_hash, use_chat

MODES = ("kv", "recompute")
_STAGES = ("tokenize", "load", "prefill", "store", "score")


@dataclasses.dataclass
class RerankStats:
    """Counters since construction: pairs scored, where document prefixes came from, seconds per stage."""

    calls: int = 0
    pairs: int = 0
    steps: int = 0  # packed scoring steps
    cache_hits: int = 0  # document prefixes already in pages (LRU)
    loaded: int = 0  # read from the store into pages
    computed: int = 0  # prefilled
    stored: int = 0  # written to the store
    evicted: int = 0
    seconds: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(_STAGES, 0.0))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Resident:
    pages: list[int]
    n: int


class _Doc:
    """One distinct document of a call; its prefix ids are tokenized only when needed."""

    def __init__(self, body: str, prompt: JudgePrompt) -> None:
        self.sha = text_hash(body)
        self.key = self.sha + prompt.fingerprint()
        self._doc, self._prompt, self._ids = {"text": body}, prompt, None

    @property
    def ids(self) -> list[int]:
        if self._ids is None:
            self._ids = self._prompt.doc_ids(self._doc)
        return self._ids


class Reranker:
    """Scores (question, document) pairs with a loaded ``TextModel`` (see the module docstring)."""

    def __init__(
        self,
        model,
        *,
        store: DocKVStore | None = None,
        mode: str = "kv",
        max_doc_tokens: int = 160,
        cache_docs: int = 64,
        token_budget: int = 1024,
        prompt_form: str = "auto",
    ) -> None:
        if mode not in MODES:
            raise SpecRagError(f"rerank mode must be one of {', '.join(MODES)} (got {mode!r})")
        if cache_docs < 0 or token_budget < 1:
            raise SpecRagError(f"cache_docs must be >= 0 and token_budget >= 1 (got {cache_docs}, {token_budget})")
        self.model, self.runner, self.store, self.mode = model, model.runner, store, mode
        self.cache_docs, self.token_budget, self.max_doc_tokens = cache_docs, token_budget, max_doc_tokens
        self.prompt = JudgePrompt.for_tokenizer(
            model.tokenizer, chat=use_chat(prompt_form, model.instruct), max_doc_tokens=max_doc_tokens
        )
        self._targets = self.prompt.targets
        self._lru: collections.OrderedDict[str, _Resident] = collections.OrderedDict()
        self.stats = RerankStats()

    # ---------------------------------------------------------------- public
    def score(self, question: str, docs: Sequence[dict]) -> list[float]:
        """One score per document, in order: log P(yes) - log P(no) (higher = more relevant)."""
        t0 = time.perf_counter()
        q = self.prompt.query_ids(question)
        cands = [_Doc(doc_body(d), self.prompt) for d in docs]
        self._tick("tokenize", t0)
        self.stats.calls += 1
        if not cands:
            return []
        if self.mode == "recompute":
            return self._score_recompute(q, cands)
        out: list[float] = []
        for group in self._groups(cands, lambda c: len(q)):
            out += self._kv_group(q, group)
        return out

    def ensure_stored(self, docs: Sequence[dict]) -> dict[str, int]:
        """Compute and store every document's prefix K/V not yet (validly) in the store.

        Returns counts: ``skipped`` (already stored), ``computed``, ``tokens`` (prefix tokens of all
        ``docs``) and ``bytes`` (their files' sizes)."""
        if self.store is None:
            raise SpecRagError("ensure_stored needs a DocKVStore")
        cands = {c.key: c for c in (_Doc(doc_body(d), self.prompt) for d in docs)}.values()
        todo = [c for c in cands if not self.store.has(self._store_key(c))]
        for group in self._groups(todo, lambda c: len(c.ids)):
            self._store_group(group)
        paths = [self.store.path(self._store_key(c)) for c in cands]
        return {
            "skipped": len(cands) - len(todo),
            "computed": len(todo),
            "tokens": sum(len(c.ids) for c in cands),
            "bytes": sum(p.stat().st_size for p in paths if p.exists()),
        }

    def _store_group(self, group: list[_Doc]) -> None:
        pins: dict[str, _Resident] = {}
        try:
            self._allocate_all(group, pins)
            self._prefill_and_store(group, pins, strict=True)
        except PoolExhausted as exc:
            if len(group) == 1:
                raise SpecRagError(f"the reranker's KV pool cannot hold one document ({exc})") from None
            self._unpin(pins)
            self._store_group(group[: len(group) // 2])
            self._store_group(group[len(group) // 2 :])
        finally:
            self._unpin(pins)

    def close(self) -> None:
        """Release every cached document's pages."""
        while self._lru:
            self._evict(next(iter(self._lru)))

    def __enter__(self) -> "Reranker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def cached_docs(self) -> int:
        return len(self._lru)

    # ---------------------------------------------------------------- scoring
    def _tick(self, stage: str, t0: float) -> float:
        now = time.perf_counter()
        self.stats.seconds[stage] += now - t0
        return now

    def _groups(self, cands: list[_Doc], cost) -> list[list[_Doc]]:
        groups: list[list[_Doc]] = [[]]
        used = 0
        for c in cands:
            if groups[-1] and used + cost(c) > self.token_budget:
                groups.append([])
                used = 0
            groups[-1].append(c)
            used += cost(c)
        return [g for g in groups if g]

    def _check_len(self, n_doc: int, n_q: int) -> None:
        if n_doc + n_q > self.runner.max_seq_len:
            raise SpecRagError(
                f"a document part of {n_doc} tokens and a question part of {n_q} exceed the "
                f"reranker's {self.runner.max_seq_len} positions; lower max_doc_tokens"
            )

    def _judge(self, chunks: list[Chunk]) -> list[float]:
        t0 = time.perf_counter()
        step = self.runner.pack(chunks)
        lp = self.runner.score(step, self._targets * len(chunks))
        self.stats.steps += 1
        self.stats.pairs += len(chunks)
        self._tick("score", t0)
        return self.prompt.scores(lp)

    def _score_recompute(self, q: list[int], cands: list[_Doc]) -> list[float]:
        out: list[float] = []
        rows = len(self._targets)
        for group in self._groups(cands, lambda c: len(c.ids) + len(q)):
            for c in group:
                self._check_len(len(c.ids), len(q))
            n = [len(c.ids) + len(q) for c in group]
            out += self._judge([Chunk([], 0, c.ids + q, write=False, rows=[k - 1] * rows) for c, k in zip(group, n)])
        return out

    def _kv_group(self, q: list[int], group: list[_Doc]) -> list[float]:
        try:
            return self._kv_group_once(q, group)
        except PoolExhausted as exc:
            if len(group) == 1:
                raise SpecRagError(f"the reranker's KV pool cannot hold one document ({exc})") from None
            half = len(group) // 2
            return self._kv_group(q, group[:half]) + self._kv_group(q, group[half:])

    def _kv_group_once(self, q: list[int], group: list[_Doc]) -> list[float]:
        for c in group:
            self._check_len(self._lru[c.key].n if c.key in self._lru else len(c.ids), len(q))
        pins: dict[str, _Resident] = {}
        try:
            self._make_resident(group, pins)
            rows = [len(q) - 1] * len(self._targets)
            return self._judge([Chunk(pins[c.key].pages, pins[c.key].n, q, write=False, rows=rows) for c in group])
        finally:
            self._unpin(pins)

    # ---------------------------------------------------------------- document pages
    def _store_key(self, c: _Doc) -> dict:
        return self.store.key(c.sha, self.max_doc_tokens, self.prompt.fingerprint(), c.ids)

    def _make_resident(self, group: list[_Doc], pins: dict[str, _Resident]) -> None:
        """Pin every document of ``group`` in pages: LRU hit, else store load, else prefill (+ store)."""
        missing: list[_Doc] = []
        for c in group:
            if c.key in pins or c.key in (m.key for m in missing):
                continue
            r = self._lru.get(c.key)
            if r is None:
                missing.append(c)
                continue
            self._lru.move_to_end(c.key)
            self.runner.allocator.retain(r.pages)
            pins[c.key] = r
            self.stats.cache_hits += 1
        if not missing:
            return
        self._allocate_all(missing, pins)
        t0 = time.perf_counter()
        loaded, compute = [], []
        for c in missing:
            kv = self.store.load(self._store_key(c)) if self.store is not None else None
            (compute.append(c) if kv is None else loaded.append((pins[c.key].pages, *kv)))
        runner_write_kv(self.runner, loaded)
        self.stats.loaded += len(loaded)
        self._tick("load", t0)
        self._prefill_and_store(compute, pins)
        for c in missing:
            self._admit(c.key, pins[c.key])

    def _allocate_all(self, docs: list[_Doc], pins: dict[str, _Resident]) -> None:
        alloc = self.runner.allocator
        for c in docs:
            need = pages_needed(len(c.ids), self.runner.page_size)
            while alloc.num_free < need:
                victim = next((k for k in self._lru if k not in pins), None)
                if victim is None:
                    break
                self._evict(victim)
            pins[c.key] = _Resident(alloc.allocate(need), len(c.ids))

    def _prefill_and_store(self, docs: list[_Doc], pins: dict[str, _Resident], strict: bool = False) -> None:
        if not docs:
            return
        t0 = time.perf_counter()
        for group in self._groups(docs, lambda c: len(c.ids)):
            step = self.runner.pack([Chunk(pins[c.key].pages, 0, c.ids) for c in group])
            self.runner.score(step, [])
        self.stats.computed += len(docs)
        t0 = self._tick("prefill", t0)
        if self.store is None:
            return
        try:
            for c in docs:
                self.store.save(self._store_key(c), *runner_read_kv(self.runner, pins[c.key].pages, len(c.ids)))
                self.stats.stored += 1
        except OSError as exc:  # a full or read-only disk must not fail reranking (it fails indexing)
            if strict:
                raise SpecRagError(f"cannot write the document K/V store {self.store.directory}: {exc}") from None
            warnings.warn(f"could not write the document K/V store: {exc}", stacklevel=2)
        self._tick("store", t0)

    def _admit(self, key: str, r: _Resident) -> None:
        if self.cache_docs == 0 or key in self._lru:
            return
        self.runner.allocator.retain(r.pages)
        self._lru[key] = r
        while len(self._lru) > self.cache_docs:
            self._evict(next(iter(self._lru)))

    def _evict(self, key: str) -> None:
        self.runner.allocator.release(self._lru.pop(key).pages)
        self.stats.evicted += 1

    def _unpin(self, pins: dict[str, _Resident]) -> None:
        for r in pins.values():
            self.runner.allocator.release(r.pages)
        pins.clear()
