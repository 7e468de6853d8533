"""Query-blocked paged tree attention in plain jnp: the reference's semantics at a CPU's cache-sized working set.

The reference scores every query against every chunk key at once: a ``[Hq, T, T]`` float32 block (200 MB per
layer at T = 2048) that every elementwise pass (mask, max, exp, sum) streams through memory. Here the queries
go in blocks of ``block`` rows, and block ``b`` scores only the chunk keys packed before its end: a token's
ancestors precede it in packed order (``packing.pack_chunks`` checks it), so later keys are never visible.
That halves the chunk work of a long step and keeps each block's scores nearer the cache (``DEFAULT_BLOCK``).

Same arguments and result as ``paged_tree_attention_reference`` (tested against it), with one extra
precondition: ``parents[i] < i`` for every chunk token (topological packed order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specrag_jax.kernels.metadata import AttentionMetadata, ancestor_mask
from specrag_jax.kernels.reference import (MASKED_SCORE, gather_sequence_kv, paged_tree_attention_reference,
                                           softcap_scores)

# Query rows per block. On the 2-core EPYC, Qwen2.5 heads, causal 2048 tokens: reference 876-1330 ms per layer,
# blocks of 128/256/512 rows 550-940 ms (noisy, shared machine); 512 compiles fastest (fewest unrolled blocks).
DEFAULT_BLOCK = 512


def paged_tree_attention_blocked(
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
    block: int = DEFAULT_BLOCK,
) -> jax.Array:
    """``paged_tree_attention_reference`` in query blocks of ``block`` rows (static, unrolled: T / block is
    at most a few tens for the token buckets). Steps of at most ``block`` tokens, and steps of several
    sequences (the decode and mixed batches, whose prefix reads dominate), take the reference unchanged."""
    t, hq, d = q.shape
    s_count = meta.page_table.shape[0]
    if t <= block or s_count != 1:
        return paged_tree_attention_reference(q, k_new, v_new, k_pool, v_pool, meta, scale=scale, window=window,
                                              softcap=softcap, tree=tree)
    hkv = k_new.shape[1]
    g = hq // hkv
    f32 = jnp.float32
    qh = (q.reshape(t, hkv, g, d).astype(f32) * scale).transpose(1, 2, 0, 3)  # [Hkv, G, T, D]
    window = jnp.asarray(window, jnp.int32)
    pos = meta.positions
    k_pre = gather_sequence_kv(k_pool, meta.page_table)[0].astype(f32)  # [L, Hkv, D]: one sequence
    v_pre = gather_sequence_kv(v_pool, meta.page_table)[0].astype(f32)
    key_idx = jnp.arange(k_pre.shape[0])
    vis_pre_all = key_idx[None, :] < meta.kv_lens[0]
    k_chk, v_chk = k_new.astype(f32), v_new.astype(f32)
    related_all = None
    if tree:
        related_all = meta.ancestors if meta.ancestors is not None else ancestor_mask(meta.parents)
    outs = []
    for start in range(0, t, block):
        end = min(start + block, t)
        rows = slice(start, end)
        qb = qh[:, :, rows]
        pb = pos[rows]
        vis_pre = vis_pre_all & ((window <= 0) | (pb[:, None] - key_idx[None, :] < window))
        s_pre = jnp.einsum("kgtd,jkd->kgtj", qb, k_pre)
        # Chunk keys [0, end): the only ones a query in this block can see.
        if tree:
            related = related_all[rows, :end]
        else:
            related = jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None]
        vis_chk = related & meta.token_valid[None, :end]
        vis_chk &= (window <= 0) | (pb[:, None] - pos[None, :end] < window)
        s_chk = jnp.einsum("kgtd,ukd->kgtu", qb, k_chk[:end])
        s_pre = jnp.where(vis_pre, softcap_scores(s_pre, softcap), MASKED_SCORE)
        s_chk = jnp.where(vis_chk, softcap_scores(s_chk, softcap), MASKED_SCORE)
        m = jnp.maximum(s_pre.max(-1), s_chk.max(-1))[..., None]
        p_pre = jnp.exp(s_pre - m)
        p_chk = jnp.exp(s_chk - m)
        denom = p_pre.sum(-1) + p_chk.sum(-1)
        pv = jnp.einsum("kgtj,jkd->kgtd", p_pre, v_pre) + jnp.einsum("kgtu,ukd->kgtd", p_chk, v_chk[:end])
        outs.append(pv / denom[..., None])
    out = jnp.concatenate(outs, axis=2).transpose(2, 0, 1, 3)  # [T, Hkv, G, D]
    out = jnp.where(meta.token_valid[:, None, None, None], out, 0.0)
    return out.reshape(t, hq, d).astype(q.dtype)
