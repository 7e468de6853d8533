"""Compact tree mask and block work lists for the Pallas tree-attention kernel (built in the wrapper).

The tree mask reaches the kernel as two int32 per token: the token's *preorder* index ``tin`` and the end
of its subtree ``tend``. Key k is an ancestor-or-self of query i exactly when ``tin[k] <= tin[i] < tend[k]``
(same sequence). ``tin``/``tend`` come from parents with pointer doubling over per-token ancestor bitmasks
(uint32 words, ``[T, T/32]``, only in the wrapper): subtree sizes are column popcounts, depths row popcounts,
and preorder = depth + path sum of "sizes of earlier siblings". With ``tree=False`` (causal by packed order)
the interval is simply [own index, end of the sequence's range). No dense [T, KV] matrix exists anywhere.

Work lists (what the kernel visits; every block not listed is skipped, never loaded):
- prefix: per query block, the (sequence, first block, end block) ranges of prefix KV blocks: sequences with
  a token in the block, blocks below ``cdiv(kv_len, kv)`` and not entirely left of the sliding window;
- chunk: per query block, the chunk-key blocks holding an ancestor-or-self of at least one query of the block
  (two binary searches per key in the block's sorted ``tin``), minus blocks wholly outside the window
  (block-level test, conservative).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.kernels.tree_block_sizes import TreeBlocks

_BIG = np.iinfo(np.int32).max


def _cdiv(a, b):
    return (a + b - 1) // b


@partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "q_info",
        "k_info",
        "pair_start",
        "pair_seq",
        "pair_lo",
        "pair_hi",
        "chunk_start",
        "chunk_blk",
        "page_table",
        "kv_lens",
        "window",
    ],
    meta_fields=["blocks", "t_pad"],
)
@dataclasses.dataclass(frozen=True)
class TreePlan:
    """Everything the kernels read besides q/k/v/pools (all int32)."""

    q_info: jax.Array  # [T_pad, 4]: seq (-1 = padding), position, tin, 0
    k_info: jax.Array  # [NC, 4, chunk]: seq (-2 = padding), position, tin, tend
    pair_start: jax.Array  # [NQ + 1] prefix ranges of query block b: pair_start[b]:pair_start[b+1]
    pair_seq: jax.Array  # [NP]
    pair_lo: jax.Array  # [NP] first prefix block
    pair_hi: jax.Array  # [NP] end prefix block
    chunk_start: jax.Array  # [NQ + 1]
    chunk_blk: jax.Array  # [NQ * NC] chunk-key block ids
    page_table: jax.Array  # [S, NPB * pages_per_block] (padded with page 0)
    kv_lens: jax.Array  # [S]
    window: jax.Array  # [1]
    blocks: TreeBlocks
    t_pad: int


def _rounds(t: int) -> int:
    """Pointer-doubling rounds that cover any path of a forest of t nodes."""
    return max(1, int(np.ceil(np.log2(max(t, 2))))) + 1


def ancestor_bits(parents: jax.Array) -> jax.Array:
    """[T, ceil(T/32)] uint32: bit j of row i set when token j is token i or one of its ancestors."""
    t = parents.shape[0]
    idx = jnp.arange(t)
    bits = (
        jnp.zeros((t, _cdiv(t, 32)), jnp.uint32)
        .at[idx, idx // 32]
        .set(jnp.left_shift(jnp.uint32(1), (idx % 32).astype(jnp.uint32)))
    )
    jump = jnp.where(parents < 0, idx, parents)
    bits, _ = jax.lax.fori_loop(0, _rounds(t), lambda _, c: (c[0] | c[0][c[1]], c[1][c[1]]), (bits, jump))
    return bits


def preorder_intervals(parents: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Preorder index ``tin`` and subtree end ``tend`` of every token of a forest (children by packed index)."""
    t = parents.shape[0]
    bits = ancestor_bits(parents)
    # Column popcounts one bit position at a time: never a [T, T] (or [T, T/32, 32]) temporary.
    col = lambda r, acc: acc.at[r].set(((bits >> r.astype(jnp.uint32)) & 1).astype(jnp.int32).sum(0))  # noqa: E731
    counts = jax.lax.fori_loop(0, 32, col, jnp.zeros((32, bits.shape[1]), jnp.int32))
    size = counts.T.reshape(-1)[:t]
    depth = jax.lax.population_count(bits).astype(jnp.int32).sum(1) - 1
    # Sizes of earlier siblings (roots of every sequence are siblings under one virtual root).
    key = jnp.where(parents < 0, -1, parents)
    order = jnp.argsort(key, stable=True)
    key_s, size_s = key[order], size[order]
    csum = jnp.cumsum(size_s)
    first = jnp.concatenate([jnp.ones((1,), bool), key_s[1:] != key_s[:-1]])
    group_base = jax.lax.cummax(jnp.where(first, csum - size_s, 0))
    off = jnp.zeros(t, jnp.int32).at[order].set(csum - size_s - group_base)
    # Path sums of off by pointer jumping (sentinel t holds 0).
    val = jnp.concatenate([off, jnp.zeros((1,), jnp.int32)])
    jump = jnp.concatenate([jnp.where(parents < 0, t, parents), jnp.array([t])])
    val, _ = jax.lax.fori_loop(0, _rounds(t), lambda _, c: (c[0] + c[0][c[1]], c[1][c[1]]), (val, jump))
    tin = depth + val[:t]
    return tin, tin + size


def _compact(keep: jax.Array, values: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Row-major compaction of ``values[keep]`` into [capacity] plus per-row starts [rows + 1]."""
    flat = keep.reshape(-1)
    rank = jnp.cumsum(flat) - 1
    out = (
        jnp.zeros(capacity, jnp.int32)
        .at[jnp.where(flat, rank, capacity)]
        .set(values.reshape(-1).astype(jnp.int32), mode="drop")
    )
    start = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(keep.sum(1)).astype(jnp.int32)])
    return out, start


def build_tree_plan(
    meta: AttentionMetadata, blocks: TreeBlocks, *, window: jax.Array | int = 0, tree: bool = True
) -> TreePlan:
    """Derive the kernel's compact mask and work lists from the metadata (jittable; O(T log T) + one fused
    O(T^2) any-reduction for the chunk block list)."""
    t = meta.token_seq.shape[0]
    s_count, p_width = meta.page_table.shape
    bq, bc, bkv = blocks.q, blocks.chunk, blocks.kv
    step = int(np.lcm(bq, bc))
    t_pad = _cdiv(t, step) * step
    nq, nc = t_pad // bq, t_pad // bc
    pad = t_pad - t
    valid = jnp.pad(meta.token_valid.astype(bool), (0, pad))
    seq = jnp.pad(meta.token_seq.astype(jnp.int32), (0, pad))
    pos = jnp.pad(meta.positions.astype(jnp.int32), (0, pad))
    window = jnp.asarray(window, jnp.int32).reshape(())
    seq_c = jnp.clip(seq, 0, s_count - 1)
    if tree:
        parents = jnp.pad(meta.parents.astype(jnp.int32), (0, pad), constant_values=-1)
        tin, tend = preorder_intervals(jnp.where(valid, parents, -1))
    else:  # causal by packed order: key k reaches the later tokens of its own sequence
        tin = seq_c * t_pad + jnp.arange(t_pad, dtype=jnp.int32)
        tend = (seq_c + 1) * t_pad
    tin_k, tend_k = jnp.where(valid, tin, _BIG), jnp.where(valid, tend, -1)  # padding keys: empty interval
    seq_q = jnp.where(valid, seq, -1)
    q_info = jnp.stack([seq_q, pos, tin, jnp.zeros_like(tin)], axis=1)
    k_info = jnp.stack([jnp.where(valid, seq, -2), pos, tin_k, tend_k]).reshape(4, nc, bc).transpose(1, 0, 2)

    # Prefix ranges per (query block, sequence).
    qb = jnp.arange(t_pad) // bq
    present = jnp.zeros((nq, s_count), bool).at[qb, seq_c].max(valid)
    min_pos = jnp.full((nq, s_count), _BIG, jnp.int32).at[qb, seq_c].min(jnp.where(valid, pos, _BIG))
    kv_lens = jnp.minimum(meta.kv_lens.astype(jnp.int32), p_width * blocks.page_size)  # as the reference
    hi = jnp.broadcast_to(_cdiv(kv_lens, bkv)[None, :], (nq, s_count))
    first_key = jnp.where(window > 0, jnp.maximum(min_pos - window + 1, 0), 0)
    lo = jnp.minimum(first_key // bkv, hi)
    keep = present & (hi > lo)
    cap = max(1, min(nq * s_count, t_pad))
    pair_seq, pair_start = _compact(keep, jnp.broadcast_to(jnp.arange(s_count)[None, :], keep.shape), cap)
    pair_lo, _ = _compact(keep, lo, cap)
    pair_hi, _ = _compact(keep, hi, cap)

    # Chunk-key blocks holding a key whose subtree interval contains a query of the block: per query block,
    # two binary searches in its sorted tins for every key ([NQ, T] ints, never [T, T]). The window test is
    # block-level (smallest query position vs. largest key position): it may keep a block, never drop one.
    tq = jnp.sort(jnp.where(valid, tin, _BIG).reshape(nq, bq), axis=1)
    hits = jax.vmap(lambda row: jnp.searchsorted(row, tend_k) > jnp.searchsorted(row, tin_k))(tq)
    need = hits.reshape(nq, nc, bc).any(axis=2)
    q_min = jnp.where(valid, pos, _BIG).reshape(nq, bq).min(1)
    k_max = jnp.where(valid, pos, 0).reshape(nc, bc).max(1)  # blocks without valid keys are not needed anyway
    q_min = jnp.where(q_min == _BIG, 0, q_min)
    need &= (window <= 0) | (q_min[:, None] - k_max[None, :] < window)
    chunk_blk, chunk_start = _compact(need, jnp.broadcast_to(jnp.arange(nc)[None, :], need.shape), nq * nc)

    npb = _cdiv(p_width, blocks.pages_per_block)
    table = jnp.pad(meta.page_table.astype(jnp.int32), ((0, 0), (0, npb * blocks.pages_per_block - p_width)))
    return TreePlan(
        q_info,
        k_info,
        pair_start,
        pair_seq,
        pair_lo,
        pair_hi,
        chunk_start,
        chunk_blk,
        table,
        kv_lens,
        window.reshape(1),
        blocks,
        t_pad,
    )


def skip_stats(plan: TreePlan) -> dict[str, float]:
    """Blocks visited vs. a dense blockwise kernel over the same layout (host side).

    Dense = every prefix block below ``kv_len`` of every sequence present in a query block, plus every
    chunk-key block holding a token of such a sequence. Returns counts and ``skipped_fraction``.
    """
    q_info, k_info = np.asarray(plan.q_info), np.asarray(plan.k_info)
    bq, bkv = plan.blocks.q, plan.blocks.kv
    kv_lens = np.asarray(plan.kv_lens)
    nq = plan.t_pad // bq
    dense_pre = dense_chk = 0
    for b in range(nq):
        seqs = {int(s) for s in q_info[b * bq : (b + 1) * bq, 0] if s >= 0}
        dense_pre += sum(-(-int(kv_lens[s]) // bkv) for s in seqs)
        dense_chk += sum(1 for c in range(k_info.shape[0]) if seqs & {int(s) for s in k_info[c, 0] if s >= 0})
    ps, ph, pl_ = (np.asarray(a) for a in (plan.pair_start, plan.pair_hi, plan.pair_lo))
    n_pairs = int(ps[-1])
    visited_pre = int((ph[:n_pairs] - pl_[:n_pairs]).sum())
    visited_chk = int(np.asarray(plan.chunk_start)[-1])
    dense = dense_pre + dense_chk
    visited = visited_pre + visited_chk
    return {
        "dense_blocks": dense,
        "visited_blocks": visited,
        "skipped_fraction": 0.0 if dense == 0 else 1.0 - visited / dense,
        "prefix_skipped_fraction": 0.0 if dense_pre == 0 else 1.0 - visited_pre / dense_pre,
        "chunk_skipped_fraction": 0.0 if dense_chk == 0 else 1.0 - visited_chk / dense_chk,
    }
