"""Reference paged tree attention in plain jnp: the ground truth and the CPU fast path.

Scores are split in two parts that share one softmax:
- *prefix*: the query against its sequence's cached KV, gathered through the page table (keys ``j <
  kv_lens[s]``, key position ``j``);
- *chunk*: the query against the step's own fresh K/V, restricted to the same sequence and to its
  ancestors-or-self (a causal chain or any token tree).
Sliding windows compare positions: key visible when ``q_pos - k_pos < window`` (window 0 = none).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specrag_jax.kernels.metadata import AttentionMetadata, ancestor_mask

MASKED_SCORE = -1e30  # a hidden key's score: exp() of it minus the row max is exactly 0


def softcap_scores(x: jax.Array, cap: float | None) -> jax.Array:
    return x if cap is None else cap * jnp.tanh(x / cap)


def gather_sequence_kv(pool: jax.Array, page_table: jax.Array) -> jax.Array:
    """[num_pages, page_size, Hkv, D] pool + [S, P] table -> [S, P * page_size, Hkv, D]."""
    s, p = page_table.shape
    pages = pool[page_table]  # [S, P, page_size, Hkv, D]
    return pages.reshape(s, p * pool.shape[1], *pool.shape[2:])


def prefix_gather_mode(num_tokens: int, num_seqs: int, kv_heads: int, group: int, head_dim: int) -> str:
    """The cheaper prefix read for a step's static shape, per key slot: per-token gathers ``T*Hkv*D`` numbers;
    per-sequence gathers ``S*Hkv*D`` and builds a ``Hq*T*S`` score block, computed and read twice (scores,
    then values), so it counts double. On a 2-core CPU (SmolLM2 heads) per-token is 4x faster for 32
    decoding sequences and 2x slower for a 256-token prefill of 1-2 sequences."""
    if num_seqs == 1:
        return "per_sequence"
    per_token = num_tokens * kv_heads * head_dim
    per_sequence = 2 * (num_seqs * kv_heads * head_dim + num_tokens * num_seqs * kv_heads * group)
    return "per_token" if per_token <= per_sequence else "per_sequence"


def paged_tree_attention_reference(
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
    prefix_gather: str = "auto",
) -> jax.Array:
    """Attention of packed queries over cached prefixes (paged) and their own chunk.

    Args:
      q: [T, Hq, D] queries (RoPE applied). k_new/v_new: [T, Hkv, D] K/V of the same tokens.
      k_pool/v_pool: [num_pages, page_size, Hkv, D] one layer's page pool (the prefix part is read from
        here; this step's tokens are taken from k_new/v_new so writes may happen before or after).
      meta: see AttentionMetadata. window: tokens (0 = unlimited), may be a traced scalar.
      tree: when False the chunk is assumed causal by packed order (cheaper mask).
      prefix_gather: how the cached prefix is read (same result): "per_sequence" gathers each sequence's KV
        once and scores every token against every sequence (cheap for few sequences and long chunks);
        "per_token" gathers each token's own sequence KV (linear in T; the decode and mixed-batch path);
        "auto" picks the one that moves fewer numbers (``prefix_gather_mode``).
    Returns: [T, Hq, D] in q's dtype; padding rows are zeros.
    """
    t, hq, d = q.shape
    hkv = k_new.shape[1]
    g = hq // hkv
    f32 = jnp.float32
    # Head-major layout [Hkv, G, T, ...] so every einsum is a plain batched matmul (no big transposes).
    qh = (q.reshape(t, hkv, g, d).astype(f32) * scale).transpose(1, 2, 0, 3)
    window = jnp.asarray(window, jnp.int32)
    pos = meta.positions

    # Prefix part: the query against its own sequence's KV, gathered through the page table.
    s_count = meta.page_table.shape[0]
    mode = prefix_gather_mode(t, s_count, hkv, g, d) if prefix_gather == "auto" else prefix_gather
    if mode not in ("per_sequence", "per_token"):
        raise ValueError(f"unknown prefix_gather {prefix_gather!r}")
    if mode == "per_token":  # each token reads its own sequence's pages: [T, L, Hkv, D]
        tables = meta.page_table[meta.token_seq]
        k_seq = gather_sequence_kv(k_pool, tables).astype(f32)
        v_seq = gather_sequence_kv(v_pool, tables).astype(f32)
        s_pre = jnp.einsum("kgtd,tjkd->kgtj", qh, k_seq)
    else:
        k_seq = gather_sequence_kv(k_pool, meta.page_table).astype(f32)  # [S, L, Hkv, D]
        v_seq = gather_sequence_kv(v_pool, meta.page_table).astype(f32)
        if s_count == 1:
            s_pre = jnp.einsum("kgtd,jkd->kgtj", qh, k_seq[0])
        else:  # score against every sequence, keep the token's own
            one_hot_seq = jax.nn.one_hot(meta.token_seq, s_count, dtype=f32)  # [T, S]
            s_pre = jnp.einsum("kgtsj,ts->kgtj", jnp.einsum("kgtd,sjkd->kgtsj", qh, k_seq), one_hot_seq)
    kv_len_max = k_seq.shape[1]
    key_idx = jnp.arange(kv_len_max)
    vis_pre = key_idx[None, :] < meta.kv_lens[meta.token_seq][:, None]
    vis_pre &= (window <= 0) | (pos[:, None] - key_idx[None, :] < window)

    # Chunk part: same sequence, ancestor-or-self.
    same_seq = meta.token_seq[:, None] == meta.token_seq[None, :]
    if tree:
        related = meta.ancestors if meta.ancestors is not None else ancestor_mask(meta.parents)
    else:
        idx = jnp.arange(t)
        related = idx[None, :] <= idx[:, None]
    vis_chk = same_seq & related & meta.token_valid[None, :]
    vis_chk &= (window <= 0) | (pos[:, None] - pos[None, :] < window)
    s_chk = jnp.einsum("kgtd,ukd->kgtu", qh, k_new.astype(f32))

    # One softmax over both parts; hidden entries get a huge negative score, so exp() makes them 0.
    s_pre = jnp.where(vis_pre, softcap_scores(s_pre, softcap), MASKED_SCORE)
    s_chk = jnp.where(vis_chk, softcap_scores(s_chk, softcap), MASKED_SCORE)
    m = jnp.maximum(s_pre.max(-1), s_chk.max(-1))[..., None]
    p_pre = jnp.exp(s_pre - m)
    p_chk = jnp.exp(s_chk - m)
    denom = p_pre.sum(-1) + p_chk.sum(-1)
    if mode == "per_token":
        pv_pre = jnp.einsum("kgtj,tjkd->kgtd", p_pre, v_seq)
    elif s_count == 1:
        pv_pre = jnp.einsum("kgtj,jkd->kgtd", p_pre, v_seq[0])
    else:
        pv_pre = jnp.einsum("kgtsj,sjkd->kgtd", p_pre[:, :, :, None, :] * one_hot_seq[:, :, None], v_seq)
    pv_chk = jnp.einsum("kgtu,ukd->kgtd", p_chk, v_new.astype(f32))
    out = (pv_pre + pv_chk) / denom[..., None]
    out = jnp.where(meta.token_valid[:, None, None, None], out.transpose(2, 0, 1, 3), 0.0)  # padding rows -> 0
    return out.reshape(t, hq, d).astype(q.dtype)
