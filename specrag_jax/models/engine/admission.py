"""Admission: turn a queued request into sequences with reserved pages, or leave it queued.

Every sequence reserves its worst case (prompt + max_new_tokens, plus ``max_budget`` tree slots when the
request speculates: a token tree is written at slots kv_len .. kv_len + B - 1, past the sequence's end; at
most the context) up front, minus the pages the prefix cache already holds, so an admitted request never
runs out of pages mid-way; cache-only pages are evicted (LRU) to make room. Nothing is admitted that the
pool cannot hold.
"""

from __future__ import annotations

from specrag_jax.kernels import PageAllocator, pages_needed
from specrag_jax.models.engine.prefix_cache import PrefixCache
from specrag_jax.models.engine.requests import Request, Seq
from specrag_jax.models.sampling.penalties import PenaltyTable


def worst_case_pages(req: Request, page_size: int, max_seq_len: int | None = None) -> int:
    """Pages the request needs with an empty cache (to refuse what can never fit)."""
    if req.kind == "score":
        return pages_needed(len(req.prefix), page_size)
    aligned = _shared_len(req, page_size)
    return aligned // page_size + sum(
        pages_needed(seq_slots(req, len(req.prefix) + len(s), max_seq_len), page_size) - aligned // page_size
        for s in req.suffixes
    )


def seq_slots(req: Request, prompt_len: int, max_seq_len: int | None = None) -> int:
    """K/V slots reserved for one sequence of ``req``: prompt, new tokens and, when it speculates, the slots of
    its largest token tree (capped at the context)."""
    slots = prompt_len + req.max_new_tokens
    if req.speculation is not None:
        slots += req.speculation.max_budget
        if max_seq_len is not None:
            slots = max(min(slots, max_seq_len), prompt_len + req.max_new_tokens)
    return slots


def _shared_len(req: Request, page_size: int) -> int:
    """Page-aligned shared prefix of a group, leaving every branch at least one prompt token to prefill."""
    if len(req.suffixes) < 2:
        return 0
    shortest = len(req.prefix) + min(len(s) for s in req.suffixes)
    return min(len(req.prefix) // page_size, (shortest - 1) // page_size) * page_size


class Admitter:
    """Reserves pages for requests against one allocator and prefix cache."""

    def __init__(
        self,
        allocator: PageAllocator,
        cache: PrefixCache,
        page_size: int,
        max_seq_len: int | None = None,
        penalties: PenaltyTable | None = None,
    ) -> None:
        self.alloc, self.cache, self.ps, self.max_seq_len = allocator, cache, page_size, max_seq_len
        self.penalties = penalties  # token-count slots of penalised sequences (None: such requests are refused)

    def _reserve(self, need: int) -> bool:
        if need > self.alloc.num_free:
            self.cache.evict(need - self.alloc.num_free)
        return need <= self.alloc.num_free

    def _undo(self, hits: list[tuple[int, list[int]]]) -> None:
        for looked_up, pages in hits:
            self.alloc.release(pages)
            self.cache.lookup_tokens -= looked_up
            self.cache.hit_tokens -= len(pages) * self.ps

    def admit(self, req: Request) -> bool:
        """Create the request's sequences with their pages and, for penalised ones, their token-count slots
        (filled with the prompt); False (nothing held) when the pool or the slots are too full."""
        slots = sum(sp.penalized for sp in req.sampling)
        if slots and (self.penalties is None or slots > self.penalties.num_free):
            return False
        if not self._admit_pages(req):
            return False
        for s in req.seqs:
            if s.sampling is not None and s.sampling.penalized:
                s.penalty_slot = self.penalties.acquire(s.prompt)
        return True

    def _admit_pages(self, req: Request) -> bool:
        ps = self.ps
        if req.kind == "score" and req.inline_prefix:  # scored in the tree's own step: no pages
            req.prefix_seq = Seq(req, -1, [], [])
            return True
        if req.kind == "score":
            hit = self.cache.match(req.prefix, len(req.prefix) // ps)
            need = pages_needed(len(req.prefix), ps) - len(hit)
            if not self._reserve(need):
                self._undo([(len(req.prefix), hit)])
                return False
            req.prefix_seq = Seq(req, -1, req.prefix, hit + self.alloc.allocate(need), prefilled=len(hit) * ps)
            req.cached_tokens = len(hit) * ps
            return True
        aligned = _shared_len(req, ps)
        if aligned:
            return self._admit_group(req, aligned)
        prompts = [req.prefix + list(s) for s in req.suffixes]
        hits = [(len(p), self.cache.match(p, (len(p) - 1) // ps)) for p in prompts]
        needs = [
            pages_needed(seq_slots(req, len(p), self.max_seq_len), ps) - len(h) for p, (_, h) in zip(prompts, hits)
        ]
        if not self._reserve(sum(needs)):
            self._undo(hits)
            return False
        for i, (p, (_, hit), n, sp) in enumerate(zip(prompts, hits, needs, req.sampling)):
            req.seqs.append(Seq(req, i, p, hit + self.alloc.allocate(n), prefilled=len(hit) * ps, sampling=sp))
        req.cached_tokens = sum(len(h) for _, h in hits) * ps
        return True

    def _admit_group(self, req: Request, aligned: int) -> bool:
        """Branches share the prefix's pages. A branch whose own prompt is cached beyond the prefix (e.g. the
        second phase of drafting, which extends the first phase's prompts) starts from its longer match."""
        ps, npre = self.ps, aligned // self.ps
        prompts = [req.prefix + list(s) for s in req.suffixes]
        own_hits: list[list[int] | None] = []
        for p in prompts:
            h = self.cache.match(p, (len(p) - 1) // ps)
            if len(h) <= npre:
                self._undo([(len(p), h)])
                h = None
            own_hits.append(h)
        shared_users = sum(h is None for h in own_hits)
        hit = self.cache.match(req.prefix[:aligned], npre) if shared_users else []
        own = [
            pages_needed(seq_slots(req, len(p), self.max_seq_len), ps) - (len(h) if h is not None else npre)
            for p, h in zip(prompts, own_hits)
        ]
        if not self._reserve((npre - len(hit) if shared_users else 0) + sum(own)):
            self._undo([(aligned, hit)] + [(len(p), h) for p, h in zip(prompts, own_hits) if h is not None])
            return False
        shared: list[int] = []
        if shared_users:
            shared = hit + self.alloc.allocate(npre - len(hit))
            req.prefix_seq = Seq(req, -1, req.prefix[:aligned], shared, prefilled=len(hit) * ps)
        done = len(hit) == npre
        for i, (p, h, n, sp) in enumerate(zip(prompts, own_hits, own, req.sampling)):
            if h is not None:
                req.seqs.append(Seq(req, i, p, h + self.alloc.allocate(n), prefilled=len(h) * ps, sampling=sp))
                continue
            self.alloc.retain(shared)
            req.seqs.append(Seq(req, i, p, shared + self.alloc.allocate(n), prefilled=aligned, sampling=sp, ready=done))
        req.shared_len = aligned
        req.cached_tokens = len(hit) * ps + sum(len(h) * ps for h in own_hits if h is not None)
        return True

    def release(self, req: Request) -> None:
        """Drop every page reference the request's sequences still hold (idempotent)."""
        for s in req.all_seqs():
            if s.penalty_slot and self.penalties is not None:
                self.penalties.release(s.penalty_slot)
                s.penalty_slot = 0
            if s.pages:
                pages, s.pages = s.pages, []
                self.alloc.release(pages)
