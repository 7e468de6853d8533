"""Decode-step paged attention in plain jnp: key blocks in a loop that stops at the longest sequence.

In a decode step each valid token is its sequence's only new token (parent -1): its chunk part is itself and
its prefix is its own sequence's pages. The general reference gathers the whole page-table bucket at once
(up to twice the longest sequence: the page buckets are powers of two), materialises the gathered keys and
values in memory and transposes them for head-major einsums. Here the keys are read in blocks of about
``key_blocks.KEY_BLOCK`` (a few pages) with an online softmax (flash-decoding) in a ``fori_loop`` whose trip count
is the longest valid sequence's block count (and, under a sliding window, starts at the window's first
block): a block's gathered K/V stays in cache, the bucket's empty tail is never read, and the queries stay
token-major so every einsum batches over the gathered keys' leading (token, head) axes as they lie.

On the 2-core EPYC (SmolLM2 heads, 8 sequences, one layer, a 128-page bucket): 600-1,200 cached tokens
1.1 ms, 150-300 tokens 0.3 ms, against 3.0 and 2.4 ms for the whole-bucket gather.

Same arguments and result as ``paged_tree_attention_reference`` on decode metadata (tested against it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specrag_jax.kernels.key_blocks import KEY_BLOCK, key_blocks, online_update, visible_keys
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.kernels.reference import MASKED_SCORE, softcap_scores


def paged_decode_attention_blocked(
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
    block_tokens: int = KEY_BLOCK,
) -> jax.Array:
    """Attention of one query token per sequence over its cached prefix and itself.

    Precondition (``pallas_decode.is_decode_step``): every valid token is the only token of its sequence
    in the step, with parent -1. q: [T, Hq, D]; k_new/v_new: [T, Hkv, D]; pools [N, page_size, Hkv, D].
    Returns [T, Hq, D] in q's dtype; padding rows are zeros.
    """
    t, hq, d = q.shape
    page_size, hkv = k_pool.shape[1], k_pool.shape[2]
    k_pool, v_pool = jnp.asarray(k_pool), jnp.asarray(v_pool)  # indexed by the loop's traced block
    g = hq // hkv
    f32 = jnp.float32
    lens = meta.kv_lens[meta.token_seq]
    pos = meta.positions
    window = jnp.asarray(window, jnp.int32)
    qh = q.reshape(t, hkv, g, d).astype(f32) * scale  # [T, Hkv, G, D]
    # each token reads its own sequence's pages
    plan = key_blocks(meta.page_table[meta.token_seq], page_size, lens, pos, meta.token_valid, window, block_tokens)

    def block(b, carry):
        pages = lax.dynamic_slice_in_dim(plan.tables, b * plan.pages, plan.pages, axis=1)  # [T, pages]
        k = k_pool[pages].reshape(t, plan.size, hkv, d).astype(f32)
        v = v_pool[pages].reshape(t, plan.size, hkv, d).astype(f32)
        s = softcap_scores(jnp.einsum("tkgd,tjkd->tkgj", qh, k), softcap)
        s = jnp.where(visible_keys(b, plan.size, lens, pos, window)[:, None, None, :], s, MASKED_SCORE)
        return online_update(carry, s, lambda p: jnp.einsum("tkgj,tjkd->tkgd", p, v))

    # The token's own key starts the softmax (always visible to itself), so the running max is finite.
    s_self = softcap_scores(jnp.einsum("tkgd,tkd->tkg", qh, k_new.astype(f32)), softcap)
    init = (s_self, jnp.ones_like(s_self), jnp.broadcast_to(v_new.astype(f32)[:, :, None, :], (t, hkv, g, d)))
    _, denom, acc = lax.fori_loop(plan.lo, plan.hi, block, init)
    out = jnp.where(meta.token_valid[:, None, None, None], acc / denom[..., None], 0.0)  # padding rows -> 0
    return out.reshape(t, hq, d).astype(q.dtype)


__all__ = ["paged_decode_attention_blocked"]
