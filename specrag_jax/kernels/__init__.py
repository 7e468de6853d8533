"""Attention ops over a paged KV pool: one contract (AttentionMetadata), several implementations."""

from __future__ import annotations

import jax

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels.blocked import paged_tree_attention_blocked
from specrag_jax.kernels.decode_blocked import paged_decode_attention_blocked
from specrag_jax.kernels.metadata import AttentionMetadata, ancestor_mask, chain_parents
from specrag_jax.kernels.page_pool import (
    NULL_PAGE,
    KVPool,
    PageAllocator,
    PoolExhausted,
    make_pool,
    pages_needed,
    slots_for,
)
from specrag_jax.kernels.reference import paged_tree_attention_reference

ATTENTION_IMPLS = ("reference", "pallas", "dense")


def paged_attention(
    q: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    meta: AttentionMetadata,
    *,
    scale: float,
    window: jax.Array | int = 0,
    softcap: float | None = None,
    tree: bool = True,
    decode: bool = False,
    impl: str = "reference",
    plan=None,
) -> jax.Array:
    """Dispatch to an implementation; every one has the semantics of ``paged_tree_attention_reference``.

    impl "reference": plain jnp (the CPU path): decode steps in key blocks, a ragged batch's (row, block)
    pairs packed so no row pays for the longest (``decode_blocked.py``), long single-sequence steps in query
    blocks (``blocked.py``; both the reference's result at a lower cost), the rest
    ``paged_tree_attention_reference``. impl "pallas": the paged
    decode kernel when ``decode`` (every sequence's chunk is one token), else the tree kernel (``plan``: its
    prebuilt work lists, optional). impl "dense": ``paged_tree_attention_reference`` itself, the whole page
    bucket at once: differentiable in reverse mode (the blocked paths loop to a traced bound, which ``jax.grad``
    cannot reverse), so training's objective uses it.
    On a CPU host the Pallas kernels run in interpret mode (slow; for tests).
    """
    if impl == "dense":
        return paged_tree_attention_reference(
            q, k_new, v_new, k_pool, v_pool, meta, scale=scale, window=window, softcap=softcap, tree=tree
        )
    if impl == "reference":
        if decode:
            return paged_decode_attention_blocked(
                q, k_new, v_new, k_pool, v_pool, meta, scale=scale, window=window, softcap=softcap
            )
        return paged_tree_attention_blocked(
            q, k_new, v_new, k_pool, v_pool, meta, scale=scale, window=window, softcap=softcap, tree=tree
        )
    if impl == "pallas":
        if decode:
            from specrag_jax.kernels.pallas_decode import paged_decode_attention_pallas

            return paged_decode_attention_pallas(
                q, k_new, v_new, k_pool, v_pool, meta, scale=scale, window=window, softcap=softcap
            )
        from specrag_jax.kernels.pallas_tree import paged_tree_attention_pallas

        return paged_tree_attention_pallas(
            q,
            k_new,
            v_new,
            k_pool,
            v_pool,
            meta,
            scale=scale,
            window=window,
            softcap=softcap,
            tree=tree,
            plan=plan,
        )
    raise SpecRagError(f"unknown attention_impl {impl!r}; choose one of {', '.join(ATTENTION_IMPLS)}")


def write_kv(pool: jax.Array, new: jax.Array, write_slots: jax.Array) -> jax.Array:
    """Write [T, Hkv, D] K (or V) into one layer's pool [N, page_size, Hkv, D] at flat slots.

    In place when the pool is donated. Slots >= N * page_size (padding, dropped tree tokens) are ignored.
    """
    page_size = pool.shape[1]
    return pool.at[write_slots // page_size, write_slots % page_size].set(new.astype(pool.dtype), mode="drop")


__all__ = [
    "ATTENTION_IMPLS",
    "AttentionMetadata",
    "KVPool",
    "NULL_PAGE",
    "PageAllocator",
    "PoolExhausted",
    "ancestor_mask",
    "chain_parents",
    "make_pool",
    "pages_needed",
    "paged_attention",
    "paged_decode_attention_blocked",
    "paged_tree_attention_blocked",
    "paged_tree_attention_reference",
    "slots_for",
    "write_kv",
]
