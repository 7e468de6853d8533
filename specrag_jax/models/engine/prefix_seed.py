"""Seeding the prefix cache with K/V computed elsewhere (a document store, another process).

A seed is a token prefix and a loader of its K/V (``[layers, n, kv_heads, head_dim]`` each, for positions
0 .. n-1, in the pool's layout). Only full pages are seeded (the cache holds full pages only); where the cache
already holds a page of the same tokens the loader is not called for it, and nothing is loaded at all when every
full page is cached. New pages come from the free list, evicting cache-only pages (LRU) when it runs short; a
seed that still does not fit is skipped (seeding is an optimisation: the prompt is prefilled as usual). Seeded
pages end cache-only, so they never block admission. Runs with the engine's lock held and no step in flight
(``Engine.seed_prefixes`` runs it between steps), because it writes the pool.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from specrag_jax.models.engine.state import EngineState
from specrag_jax.models.executor.kv_transfer import runner_write_kv

KVLoader = Callable[[], "tuple[np.ndarray, np.ndarray] | None"]  # -> (k, v) or None (not available)
Seed = tuple[Sequence[int], KVLoader]


def seed_prefix(state: EngineState, tokens: Sequence[int], load: KVLoader) -> int:
    """Put the full pages of ``tokens`` that are not cached into the prefix cache; returns pages added."""
    cache, runner = state.cache, state.runner
    ps, alloc = cache.page_size, runner.allocator
    n_full = len(tokens) // ps
    if not cache.enabled or n_full == 0:
        return 0
    held = cache.match(tokens, n_full, count=False)
    try:
        need = n_full - len(held)
        if need == 0:
            return 0
        kv = load()
        if kv is None or kv[0].shape[1] < n_full * ps:
            return 0
        if alloc.num_free < need:
            cache.evict(need - alloc.num_free)
        if alloc.num_free < need:
            return 0
        start, stop = len(held) * ps, n_full * ps
        new = alloc.allocate(need)
        held += new
        k, v = kv
        runner_write_kv(runner, [(new, np.asarray(k[:, start:stop]), np.asarray(v[:, start:stop]))])
        return cache.insert(list(tokens[:stop]), held)
    finally:
        alloc.release(held)


def seed_prefixes(state: EngineState, seeds: Sequence[Seed]) -> int:
    """``seed_prefix`` for each seed in order; returns pages added in all."""
    return sum(seed_prefix(state, tokens, load) for tokens, load in seeds)
