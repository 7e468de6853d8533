"""Blocked paged tree attention in plain jnp: the reference's semantics, reading only what a step can see.

The reference scores every query against its sequence's whole page-table bucket and every chunk key at
once. Two kinds of waste follow on a CPU: the bucket is sized for the prompt plus its answer (pages are
powers of two), so an early prefill chunk of a long prompt scores a mostly empty bucket, and a long step's
``[Hq, T, T + L]`` float32 scores stream through memory in every elementwise pass. Here:

- the cached prefix is read in key blocks of ``key_block`` tokens with an online softmax (flash style), in a
  ``fori_loop`` from the first block a valid token can see (sliding windows) to the longest valid prefix:
  the bucket's empty tail is never read and each block's scores stay near the cache;
- a single long sequence's queries go in static blocks of ``block`` rows, and block ``b`` scores only the
  chunk keys packed before its end: a token's ancestors precede it in packed order (``packing.pack_chunks``
  checks it), so later keys are never visible.

Several sequences read their prefixes per token when that is cheaper (``prefix_gather_mode``: many one-token
sequences), else sequence by sequence, each key block against a window of its own sequence's rows
(``prefix_segments``).
Same arguments and result as ``paged_tree_attention_reference`` (tested against it), with one extra
precondition: ``parents[i] < i`` for every chunk token (topological packed order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specrag_jax.kernels import prefix_segments
from specrag_jax.kernels.key_blocks import KEY_BLOCK, key_blocks, online_update, visible_keys
from specrag_jax.kernels.metadata import AttentionMetadata, ancestor_mask
from specrag_jax.kernels.reference import MASKED_SCORE, prefix_gather_mode, softcap_scores

# Query rows per block. On the 2-core EPYC, Qwen2.5 heads, causal 2048 tokens: reference 876-1330 ms per layer,
# blocks of 128/256/512 rows 550-940 ms (noisy, shared machine); 512 compiles fastest (fewest unrolled blocks).
DEFAULT_BLOCK = 512
SEGMENTED_PREFIX = True  # several sequences' prefixes read sequence by sequence (``prefix_segments``); A/B switch


def _prefix_scores(qh, k, mode: str, token_seq, s_count: int):
    """[Hkv, G, T, blk] scores of each query against its own sequence's block of keys.
    ``k``: [blk, Hkv, D] (one sequence), [S, blk, Hkv, D] (per sequence) or [T, blk, Hkv, D] (per token)."""
    if s_count == 1:
        return jnp.einsum("kgtd,jkd->kgtj", qh, k)
    if mode == "per_token":
        return jnp.einsum("kgtd,tjkd->kgtj", qh, k)
    one_hot = jax.nn.one_hot(token_seq, s_count, dtype=qh.dtype)  # score every sequence, keep the token's own
    return jnp.einsum("kgtsj,ts->kgtj", jnp.einsum("kgtd,sjkd->kgtsj", qh, k), one_hot)


def _prefix_values(p, v, mode: str, token_seq, s_count: int):
    """[Hkv, G, T, D]: ``p`` [Hkv, G, T, blk] times each query's own sequence's block of values."""
    if s_count == 1:
        return jnp.einsum("kgtj,jkd->kgtd", p, v)
    if mode == "per_token":
        return jnp.einsum("kgtj,tjkd->kgtd", p, v)
    one_hot = jax.nn.one_hot(token_seq, s_count, dtype=p.dtype)
    return jnp.einsum("kgtsj,sjkd->kgtd", p[:, :, :, None, :] * one_hot[:, :, None], v)


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
    key_block: int = KEY_BLOCK,
) -> jax.Array:
    """``paged_tree_attention_reference`` with the prefix in key blocks up to the longest valid prefix and,
    for one sequence longer than ``block`` tokens, the queries in static blocks of ``block`` rows."""
    t, hq, d = q.shape
    page_size, hkv = k_pool.shape[1], k_pool.shape[2]
    k_pool, v_pool = jnp.asarray(k_pool), jnp.asarray(v_pool)  # indexed by the loop's traced block
    g = hq // hkv
    f32 = jnp.float32
    s_count = meta.page_table.shape[0]
    mode = prefix_gather_mode(t, s_count, hkv, g, d)
    qh = (q.reshape(t, hkv, g, d).astype(f32) * scale).transpose(1, 2, 0, 3)  # [Hkv, G, T, D]
    window = jnp.asarray(window, jnp.int32)
    pos = meta.positions
    valid = meta.token_valid
    tables = meta.page_table
    if mode == "per_token" and s_count > 1:
        tables = tables[meta.token_seq]  # [T, P]: each token reads its own sequence's pages
    lens = meta.kv_lens[meta.token_seq]  # [T] cached keys each token may see
    plan = key_blocks(tables, page_size, lens, pos, valid, window, key_block)
    k_chk, v_chk = k_new.astype(f32), v_new.astype(f32)
    related_all = None
    if tree:
        related_all = meta.ancestors if meta.ancestors is not None else ancestor_mask(meta.parents)
    q_block = block if s_count == 1 else t  # several sequences: one query block (their prefix reads dominate)
    # several sequences in a step longer than one row window: each key block against its own sequence's rows
    segments = s_count > 1 and mode == "per_sequence" and t > prefix_segments.ROW_WINDOW and SEGMENTED_PREFIX
    outs = []
    for start in range(0, t, q_block):
        end = min(start + q_block, t)
        rows = slice(start, end)
        qb, pb, lb = qh[:, :, rows], pos[rows], lens[rows]
        # Chunk keys [0, end): the only ones a query in this block can see. They start the softmax.
        related = related_all[rows, :end] if tree else jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None]
        vis_chk = related & valid[None, :end] & (meta.token_seq[rows, None] == meta.token_seq[None, :end])
        vis_chk &= (window <= 0) | (pb[:, None] - pos[None, :end] < window)
        s_chk = softcap_scores(jnp.einsum("kgtd,ukd->kgtu", qb, k_chk[:end]), softcap)
        s_chk = jnp.where(vis_chk, s_chk, MASKED_SCORE)
        m0 = s_chk.max(-1)
        p_chk = jnp.exp(s_chk - m0[..., None])
        init = (m0, p_chk.sum(-1), jnp.einsum("kgtu,ukd->kgtd", p_chk, v_chk[:end]))
        seq_rows = meta.token_seq[rows]  # several sequences: all rows (one query block)

        def key_step(b, carry, qb=qb, pb=pb, lb=lb, seq_rows=seq_rows):
            pages = lax.dynamic_slice_in_dim(plan.tables, b * plan.pages, plan.pages, axis=1)
            k = k_pool[pages].astype(f32)  # [rows, pages, page_size, Hkv, D]
            v = v_pool[pages].astype(f32)
            k = k.reshape(*k.shape[:-4], plan.size, hkv, d)
            v = v.reshape(*v.shape[:-4], plan.size, hkv, d)
            if s_count == 1:
                k, v = k[0], v[0]
            s = softcap_scores(_prefix_scores(qb, k, mode, seq_rows, s_count), softcap)
            s = jnp.where(visible_keys(b, plan.size, lb, pb, window), s, MASKED_SCORE)
            return online_update(carry, s, lambda p: _prefix_values(p, v, mode, seq_rows, s_count))

        if segments:
            _, denom, acc = prefix_segments.segment_prefix(
                qb, k_pool, v_pool, plan, meta.kv_lens, meta.token_seq, pos, valid, init, window=window, softcap=softcap
            )
        else:
            _, denom, acc = lax.fori_loop(plan.lo, plan.hi, key_step, init)
        outs.append(acc / denom[..., None])
    out = jnp.concatenate(outs, axis=2).transpose(2, 0, 1, 3)  # [T, Hkv, G, D]
    out = jnp.where(valid[:, None, None, None], out, 0.0)  # padding rows -> 0
    return out.reshape(t, hq, d).astype(q.dtype)


__all__ = ["DEFAULT_BLOCK", "KEY_BLOCK", "paged_tree_attention_blocked"]
