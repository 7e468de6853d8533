"""Decode-step paged attention in plain jnp: cached keys in blocks with an online softmax (flash-decoding).

In a decode step each valid token is its sequence's only new token (parent -1): its chunk part is itself and
its prefix is its own sequence's pages. The general reference gathers the whole page-table bucket at once
(up to twice the longest sequence: the page buckets are powers of two), materialises the gathered keys and
values in memory and transposes them for head-major einsums. Here the keys are read in blocks of about
``key_blocks.KEY_BLOCK`` (a few pages), and a block's gathered K/V stays in cache.

Two loop schedules, the same result:

- *lockstep*: a ``fori_loop`` over block indices up to the longest valid row's last block (under a sliding window
  from the earliest window's first block), every row reading its own block of that index; the bucket's empty
  tail is never read, but every row pays for the longest row, and padding rows (a sticky decode width's
  finished drafts) pay too.
- *packed*: the step's (row, block) pairs are numbered row by row, and each iteration reads the next ``T`` of
  them, one per slot, whichever rows they belong to; a slot's block result (its max, sum and weighted values)
  is merged into its row's online-softmax state by scatter. A step costs its rows' blocks in all: a
  3,000-token sequence beside seven short ones is not read eight times, padding rows read nothing.

A step of one row runs lockstep; a step of several rows takes packed when it needs fewer iterations (a
``lax.cond`` on the step's block counts: the merge costs ~10% an iteration, so equal rows stay in lockstep).
Measured (``benchmarks/attention_paths.py``, one layer): SmolLM2 heads, five rows of which two live 1.11 -> 0.38
ms, five drafts of 150-450 cached tokens 0.70 -> 0.55 ms; Qwen2.5 heads, eight sequences of 60-3,000 cached
tokens 8.5 -> 2.8 ms. Whole SmolLM2 decode steps: ``benchmarks/decode_schedule.py``.

Same arguments and result as ``paged_tree_attention_reference`` on decode metadata (tested against it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specrag_jax.kernels.key_blocks import KEY_BLOCK, first_visible_key, key_blocks, online_update, visible_keys
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.kernels.reference import MASKED_SCORE, softcap_scores

PACKED_DECODE = True  # steps of several rows may take the packed schedule (read at trace time; the A/B switch)


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
    packed: bool | None = None,
) -> jax.Array:
    """Attention of one query token per sequence over its cached prefix and itself.

    Precondition (``pallas_decode.is_decode_step``): every valid token is the only token of its sequence
    in the step, with parent -1. q: [T, Hq, D]; k_new/v_new: [T, Hkv, D]; pools [N, page_size, Hkv, D].
    ``packed``: force a loop schedule (None: a step of several rows chooses per step, one row runs lockstep;
    ``PACKED_DECODE`` off: lockstep). Returns [T, Hq, D] in q's dtype; padding rows are zeros.
    """
    t, hq, d = q.shape
    page_size, hkv = k_pool.shape[1], k_pool.shape[2]
    k_pool, v_pool = jnp.asarray(k_pool), jnp.asarray(v_pool)  # indexed by the loop's traced block
    f32 = jnp.float32
    lens = jnp.asarray(meta.kv_lens)[meta.token_seq]
    pos = jnp.asarray(meta.positions)
    window = jnp.asarray(window, jnp.int32)
    qh = q.reshape(t, hkv, hq // hkv, d).astype(f32) * scale  # [T, Hkv, G, D]
    # each token reads its own sequence's pages
    plan = key_blocks(meta.page_table[meta.token_seq], page_size, lens, pos, meta.token_valid, window, block_tokens)

    def read(queries, pages):
        """Scores [T, Hkv, G, size] of ``queries`` against the keys of ``pages`` [T, pages], and the values."""
        k = k_pool[pages].reshape(t, plan.size, hkv, d).astype(f32)
        v = v_pool[pages].reshape(t, plan.size, hkv, d).astype(f32)
        return softcap_scores(jnp.einsum("tkgd,tjkd->tkgj", queries, k), softcap), v

    # The token's own key starts the softmax (always visible to itself), so the running max is finite.
    s_self = softcap_scores(jnp.einsum("tkgd,tkd->tkg", qh, k_new.astype(f32)), softcap)
    init = (s_self, jnp.ones_like(s_self), jnp.broadcast_to(v_new.astype(f32)[:, :, None, :], (*s_self.shape, d)))
    rows = jnp.arange(t)

    def lockstep(b, carry):
        s, v = read(qh, lax.dynamic_slice_in_dim(plan.tables, b * plan.pages, plan.pages, axis=1))
        s = jnp.where(visible_keys(b, plan.size, lens, pos, window)[:, None, None, :], s, MASKED_SCORE)
        return online_update(carry, s, lambda p: jnp.einsum("tkgj,tjkd->tkgd", p, v))

    first = first_visible_key(pos, window) // plan.size  # [T] each row's block range [first, last)
    counts = jnp.where(meta.token_valid, jnp.maximum((lens + plan.size - 1) // plan.size, first) - first, 0)
    ends = jnp.cumsum(counts)  # pairs numbered row by row
    starts, total = ends - counts, ends[-1]
    flat_tables = plan.tables.reshape(-1)

    def pairs(j, carry):
        m, denom, acc = carry
        pair = j * t + rows  # this iteration's pairs, one per slot
        row = jnp.minimum(jnp.searchsorted(ends, pair, side="right"), t - 1)
        b = first[row] + pair - starts[row]
        pages = (row * plan.tables.shape[1] + b * plan.pages)[:, None] + jnp.arange(plan.pages)[None, :]
        s, v = read(qh[row], flat_tables[pages])
        s = jnp.where(visible_keys(b, plan.size, lens[row], pos[row], window)[:, None, None, :], s, MASKED_SCORE)
        target = jnp.where(pair < total, row, t)  # a slot past the last pair: dropped by the scatters
        s_max = s.max(-1)  # [slots, Hkv, G]
        m_new = m.at[target].max(s_max, mode="drop")
        p = jnp.exp(s - s_max[..., None])
        w = jnp.exp(s_max - m_new[row])  # the slot's block rescaled to its row's new max
        c = jnp.exp(m - m_new)
        denom = (denom * c).at[target].add(w * p.sum(-1), mode="drop")
        values = jnp.einsum("tkgj,tjkd->tkgd", p, v) * w[..., None]
        return m_new, denom, (acc * c[..., None]).at[target].add(values, mode="drop")

    def run_lockstep(carry):
        return lax.fori_loop(plan.lo, plan.hi, lockstep, carry)

    def run_packed(carry):
        return lax.fori_loop(0, (total + t - 1) // t, pairs, carry)

    if packed is None and PACKED_DECODE and t > 1:  # packed where it takes fewer iterations
        _, denom, acc = lax.cond((total + t - 1) // t < plan.hi - plan.lo, run_packed, run_lockstep, init)
    else:
        _, denom, acc = (run_packed if packed else run_lockstep)(init)
    out = jnp.where(meta.token_valid[:, None, None, None], acc / denom[..., None], 0.0)  # padding rows -> 0
    return out.reshape(t, hq, d).astype(q.dtype)


__all__ = ["paged_decode_attention_blocked"]
