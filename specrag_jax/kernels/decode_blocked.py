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

Two head forms of a block's products, the same result:

- *grouped*: each KV head's G query heads against its keys, products batched over (row, KV head). The gathered
  block lies token-major ``[rows, keys, Hkv, D]``, so XLA:CPU copies it head-major before every product: in a
  profile of SmolLM2's 5-row decode step those gather-and-transpose copies were ~22% of the step's thread time,
  more than the block products themselves (a 128-key block of 5 rows: ~85 us against ~35 us).
- *stacked*: every query head against all KV heads' keys side by side, its query placed in its own KV head's
  ``D`` columns of a block-diagonal ``[Hq, Hkv * D]`` matrix (zeros elsewhere): products batched over rows only,
  reading the gathered block as it lies, at Hkv times the multiplies (a decode step's attention multiplies are
  few; the accumulator keeps each head's own diagonal block at the end). Taken up to ``STACKED_MAX_KV_HEADS``
  in a one-device process (a mesh sharding the heads would all-reduce its products; the CPU path: GPUs and TPUs
  take the Pallas kernels). One difference: a non-finite key at a visible position spoils every query head's
  score in the stacked form (0 * inf), only its own KV head's in the grouped one.
  Measured on whole SmolLM2 decode steps, stacked / grouped decode time (``benchmarks/decode_schedule.py --switch
  heads``, ``benchmarks/results/decode_stacked_heads.json``): ragged 8 rows of 60-3,000 cached tokens 0.90x, 8 x 400
  0.86x, 4 x 2,000 0.90x; drafting's short rows (~240 tokens) unchanged (``drafting_steps.py --ab heads``: decode
  0.99x, drafting 1.01x).

Same arguments and result as ``paged_tree_attention_reference`` on decode metadata (tested against it).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specrag_jax.kernels.key_blocks import KEY_BLOCK, first_visible_key, key_blocks, online_update, visible_keys
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.kernels.reference import MASKED_SCORE, softcap_scores

PACKED_DECODE = True  # steps of several rows may take the packed schedule (read at trace time; the A/B switch)
STACKED_HEADS = True  # the stacked head form where ``use_stacked`` allows it (read at trace time; the A/B switch)
STACKED_MAX_KV_HEADS = 4  # its products do Hkv times the grouped form's multiplies

Products = Callable[[jax.Array, jax.Array], jax.Array]  # (a block's queries or probabilities, its keys or values)


class HeadForm(NamedTuple):
    """How a block's products see the heads: the queries, the accumulator's start, a block's scores [rows, Hq,
    keys] from its keys [rows, keys, Hkv, D], its probabilities' weighted values, and the accumulator's end."""

    queries: jax.Array
    acc0: jax.Array
    scores: Products
    values: Products
    finish: Callable[[jax.Array], jax.Array]


def use_stacked(kv_heads: int, stacked: bool | None = None) -> bool:
    """Whether decode attention takes the stacked head form (``stacked`` None: ``STACKED_HEADS``, at most
    ``STACKED_MAX_KV_HEADS`` KV heads, and one device: its products contract over all KV heads at once, which a
    mesh sharding the heads would all-reduce every layer, where the grouped form keeps each head on its shard)."""
    if stacked is not None:
        return stacked
    return STACKED_HEADS and kv_heads <= STACKED_MAX_KV_HEADS and jax.device_count() == 1


def _grouped_heads(qh: jax.Array, v_new: jax.Array) -> HeadForm:
    """Each KV head's G query heads against its keys: products batched over (row, KV head), which XLA:CPU runs
    after copying each gathered block head-major."""
    t, hkv, g, d = qh.shape

    def scores(queries: jax.Array, k: jax.Array) -> jax.Array:
        return jnp.einsum("tkgd,tjkd->tkgj", queries, k).reshape(k.shape[0], hkv * g, k.shape[1])

    def values(p: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.einsum("tkgj,tjkd->tkgd", p.reshape(v.shape[0], hkv, g, -1), v).reshape(v.shape[0], hkv * g, d)

    acc0 = jnp.broadcast_to(v_new.astype(jnp.float32)[:, :, None, :], qh.shape).reshape(t, hkv * g, d)
    return HeadForm(qh, acc0, scores, values, lambda acc: acc)


def _stacked_heads(qh: jax.Array, v_new: jax.Array) -> HeadForm:
    """Every query head against all KV heads' keys side by side (a block-diagonal query [Hq, Hkv * D]): products
    batched over rows only, reading the gathered block as it lies (no copy), at Hkv times the multiplies; the
    accumulator keeps each head's own diagonal block at the end."""
    t, hkv, g, d = qh.shape
    eye = jnp.eye(hkv, dtype=qh.dtype)
    queries = (qh[:, :, :, None, :] * eye[None, :, None, :, None]).reshape(t, hkv * g, hkv * d)

    def scores(queries: jax.Array, k: jax.Array) -> jax.Array:
        return jnp.einsum("tqc,tjc->tqj", queries, k.reshape(*k.shape[:2], hkv * d))

    def values(p: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.einsum("tqj,tjc->tqc", p, v.reshape(*v.shape[:2], hkv * d))

    def finish(acc: jax.Array) -> jax.Array:
        own = jnp.diagonal(acc.reshape(t, hkv, g, hkv, d), axis1=1, axis2=3)  # [T, G, D, Hkv]
        return jnp.moveaxis(own, -1, 1).reshape(t, hkv * g, d)

    acc0 = jnp.broadcast_to(v_new.astype(jnp.float32).reshape(t, 1, hkv * d), (t, hkv * g, hkv * d))
    return HeadForm(queries, acc0, scores, values, finish)


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
    stacked: bool | None = None,
) -> jax.Array:
    """Attention of one query token per sequence over its cached prefix and itself.

    Precondition (``pallas_decode.is_decode_step``): every valid token is the only token of its sequence
    in the step, with parent -1. q: [T, Hq, D]; k_new/v_new: [T, Hkv, D]; pools [N, page_size, Hkv, D].
    ``packed``: force a loop schedule (None: a step of several rows chooses per step, one row runs lockstep;
    ``PACKED_DECODE`` off: lockstep); ``stacked``: force a head form (None: ``use_stacked``). Returns [T, Hq, D]
    in q's dtype; padding rows are zeros.
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
    form = (_stacked_heads if use_stacked(hkv, stacked) else _grouped_heads)(qh, v_new)

    def read(queries, pages):
        """Scores [rows, Hq, size] of ``queries`` against the keys of ``pages`` [rows, pages], and the function
        taking the block's probabilities to its weighted values."""
        k, v = (pool[pages].reshape(pages.shape[0], plan.size, hkv, d).astype(f32) for pool in (k_pool, v_pool))
        return softcap_scores(form.scores(queries, k), softcap), functools.partial(form.values, v=v)

    # The token's own key starts the softmax (always visible to itself), so the running max is finite.
    s_self = softcap_scores(jnp.einsum("tkgd,tkd->tkg", qh, k_new.astype(f32)), softcap).reshape(t, hq)
    init = (s_self, jnp.ones_like(s_self), form.acc0)
    rows = jnp.arange(t)

    def lockstep(b, carry):
        s, values_of = read(form.queries, lax.dynamic_slice_in_dim(plan.tables, b * plan.pages, plan.pages, axis=1))
        s = jnp.where(visible_keys(b, plan.size, lens, pos, window)[:, None, :], s, MASKED_SCORE)
        return online_update(carry, s, values_of)

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
        s, values_of = read(form.queries[row], flat_tables[pages])
        s = jnp.where(visible_keys(b, plan.size, lens[row], pos[row], window)[:, None, :], s, MASKED_SCORE)
        target = jnp.where(pair < total, row, t)  # a slot past the last pair: dropped by the scatters
        s_max = s.max(-1)  # [slots, Hq]
        m_new = m.at[target].max(s_max, mode="drop")
        p = jnp.exp(s - s_max[..., None])
        w = jnp.exp(s_max - m_new[row])  # the slot's block rescaled to its row's new max
        c = jnp.exp(m - m_new)
        denom = (denom * c).at[target].add(w * p.sum(-1), mode="drop")
        values = values_of(p) * w[..., None]
        return m_new, denom, (acc * c[..., None]).at[target].add(values, mode="drop")

    def run_lockstep(carry):
        return lax.fori_loop(plan.lo, plan.hi, lockstep, carry)

    def run_packed(carry):
        return lax.fori_loop(0, (total + t - 1) // t, pairs, carry)

    if packed is None and PACKED_DECODE and t > 1:  # packed where it takes fewer iterations
        _, denom, acc = lax.cond((total + t - 1) // t < plan.hi - plan.lo, run_packed, run_lockstep, init)
    else:
        _, denom, acc = (run_packed if packed else run_lockstep)(init)
    out = jnp.where(meta.token_valid[:, None, None], form.finish(acc) / denom[..., None], 0.0)  # padding -> 0
    return out.astype(q.dtype)


__all__ = ["paged_decode_attention_blocked", "use_stacked"]
