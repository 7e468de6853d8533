"""Paged K/V transfer between a pool and the host (the design card's "paged KV loading"), whole
sequences at a time (``kernels.write_kv``, by contrast, writes one step's new K/V into its pool slots).

``pool_to_host`` gathers the first ``n`` tokens of a sequence's pages into host arrays ``[L, n, Hkv, D]`` (K
and V); ``host_to_pool`` scatters such arrays into pages at logical slots ``0 .. n-1`` with the pool donated,
so it updates in place. Both index the 4-D page arrays as ``layer[page, offset]``: a scatter through a
flattened view makes XLA copy the whole pool (see ``speculative.verify_step.compact_accepted``). Token counts
are padded to powers of two (at least ``MIN_BUCKET``) with dropped slots, so a handful of programs cover every
length.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import NULL_PAGE, KVPool
from specrag_jax.models.executor.packing import bucket

MIN_BUCKET = 16


@jax.jit
def _gather(pool: KVPool, page_ids: jax.Array, offsets: jax.Array) -> tuple[jax.Array, jax.Array]:
    k = jnp.stack([layer[page_ids, offsets] for layer in pool.k])
    v = jnp.stack([layer[page_ids, offsets] for layer in pool.v])
    return k, v


def _scatter_body(pool: KVPool, page_ids: jax.Array, offsets: jax.Array, k: jax.Array, v: jax.Array) -> KVPool:
    def put(layer: jax.Array, rows: jax.Array) -> jax.Array:
        return layer.at[page_ids, offsets].set(rows.astype(layer.dtype), mode="drop")

    return KVPool(
        k=tuple(put(x, k[i]) for i, x in enumerate(pool.k)), v=tuple(put(x, v[i]) for i, x in enumerate(pool.v))
    )


_scatter = jax.jit(_scatter_body, donate_argnames=("pool",))
_SHARDED: dict = {}  # one scatter per sharded pool layout


def _locations(pages: Sequence[int], n: int, page_size: int, num_pages: int) -> tuple[np.ndarray, np.ndarray]:
    """Page ids and offsets of logical slots ``0 .. n-1`` of ``pages``."""
    if n < 0 or n > len(pages) * page_size:
        raise SpecRagError(f"{n} tokens do not fit in {len(pages)} pages of {page_size}")
    logical = np.arange(n)
    page_ids = np.asarray(pages, np.int64).reshape(-1)[logical // page_size] if n else np.zeros(0, np.int64)
    if np.any((page_ids <= NULL_PAGE) | (page_ids >= num_pages)):
        raise SpecRagError(f"page ids must be in 1..{num_pages - 1} (got {sorted(set(page_ids.tolist()))[:4]})")
    return page_ids.astype(np.int32), (logical % page_size).astype(np.int32)


def _padded(ids: np.ndarray, offsets: np.ndarray, fill: int) -> tuple[np.ndarray, np.ndarray]:
    n_pad = bucket(len(ids), MIN_BUCKET)
    pid = np.full(n_pad, fill, np.int32)
    off = np.zeros(n_pad, np.int32)
    pid[: len(ids)], off[: len(ids)] = ids, offsets
    return pid, off


def pool_to_host(pool: KVPool, pages: Sequence[int], n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Host copies (K, V), each ``[L, n_tokens, Hkv, D]`` in the pool's dtype, of a sequence's first tokens."""
    ids, offsets = _locations(pages, n_tokens, pool.page_size, pool.num_pages)
    pid, off = _padded(ids, offsets, NULL_PAGE)
    k, v = _gather(pool, pid, off)
    return np.asarray(k)[:, :n_tokens], np.asarray(v)[:, :n_tokens]


def host_to_pool_many(
    pool: KVPool, items: Sequence[tuple[Sequence[int], np.ndarray, np.ndarray]], pool_shardings: KVPool | None = None
) -> KVPool:
    """Scatter each ``(pages, k, v)`` (``k``/``v`` ``[L, n, Hkv, D]``) into its pages at slots ``0 .. n-1``, all
    in one call; ``pool`` is donated (use the returned pool). ``pool_shardings``: keep a sharded pool's layout."""
    if not items:
        return pool
    layers = len(pool.k)
    _, _, hkv, d = pool.k[0].shape
    ids, offs, ks, vs = [], [], [], []
    for pages, k, v in items:
        if k.shape != v.shape or k.ndim != 4 or k.shape[0] != layers or k.shape[2:] != (hkv, d):
            raise SpecRagError(f"K/V of shape {k.shape}/{v.shape} do not match the pool ([{layers}, n, {hkv}, {d}])")
        i, o = _locations(pages, k.shape[1], pool.page_size, pool.num_pages)
        ids.append(i)
        offs.append(o)
        ks.append(k)
        vs.append(v)
    pid, off = _padded(np.concatenate(ids), np.concatenate(offs), pool.num_pages)  # padding: dropped
    dtype = np.dtype(pool.k[0].dtype)
    k_all = np.zeros((layers, pid.shape[0], hkv, d), dtype)
    v_all = np.zeros_like(k_all)
    start = 0
    for k, v in zip(ks, vs):  # one copy from (possibly memory-mapped) host arrays into the padded batch
        k_all[:, start : start + k.shape[1]] = k
        v_all[:, start : start + k.shape[1]] = v
        start += k.shape[1]
    if pool_shardings is None:
        return _scatter(pool, pid, off, k_all, v_all)
    if pool_shardings not in _SHARDED:
        _SHARDED[pool_shardings] = jax.jit(_scatter_body, donate_argnames=("pool",), out_shardings=pool_shardings)
    return _SHARDED[pool_shardings](pool, pid, off, k_all, v_all)


def host_to_pool(pool: KVPool, pages: Sequence[int], k: np.ndarray, v: np.ndarray) -> KVPool:
    """Scatter one sequence's ``[L, n, Hkv, D]`` K and V into ``pages`` at slots ``0 .. n-1`` (pool donated)."""
    return host_to_pool_many(pool, [(pages, np.asarray(k), np.asarray(v))])


def runner_read_kv(runner, pages: Sequence[int], n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``pool_to_host`` on a ``ModelRunner``'s pool."""
    return pool_to_host(runner.pool, pages, n_tokens)


def runner_write_kv(runner, items: Sequence[tuple[Sequence[int], np.ndarray, np.ndarray]]) -> None:
    """``host_to_pool_many`` into a ``ModelRunner``'s pool (the runner keeps the updated pool)."""
    runner.pool = host_to_pool_many(runner.pool, items, runner.pool_shardings)
