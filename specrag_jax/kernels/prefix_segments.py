"""Several sequences' cached prefixes read sequence by sequence: the blocked CPU path's multi-sequence prefill.

A step that packs several sequences' prompt chunks (drafting's m branches, a server's mixed batch) scores each
token against its own sequence's cached keys only. Scoring every token against every sequence's key block and
keeping its own (the one-hot form of ``blocked._prefix_scores``) does S times the work and materialises
``[Hkv, G, T, S, key_block]`` scores twice per block: on a 2-core CPU, SmolLM2's five 100-token drafting branches
after a 48-token prefix spent 30 ms a layer there against 4.8 ms for one 512-token sequence, about half of the
whole 512-token step.

Here one loop with a traced bound runs over (sequence, window of ``ROW_WINDOW`` consecutive packed rows covering its
tokens, key block of its prefix) triples: each key block is gathered from one page table and scored against one
window of rows. (Three nested loops ran as fast and compiled ~1.2x slower: 5.6 against 4.2-4.7 s for thirty
layers of it at XLA's default level, against 2.4 s for the one-hot read, so ``blocked`` takes this read only for
steps longer than one window, where the one-hot read's waste is large.) A row outside the window's share
of its sequence (another sequence's, padding, or a row an earlier window already covered when the last window is
shifted back to fit) is masked, and a fully masked row leaves the online-softmax state exactly as it was (its
running max is a real score: every valid row sees itself among the chunk keys first). Each sequence's tokens
are contiguous in packed order (``packing.pack_chunks`` packs one chunk per sequence); were they not, the windows
would still cover the span from its first to its last token, only with more masked rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specrag_jax.kernels.key_blocks import KeyBlocks, first_visible_key, online_update, visible_keys
from specrag_jax.kernels.reference import MASKED_SCORE, softcap_scores

ROW_WINDOW = 128  # packed rows scored against a key block at once


def segment_prefix(
    qh: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    plan: KeyBlocks,
    kv_lens: jax.Array,
    token_seq: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    carry: tuple[jax.Array, jax.Array, jax.Array],
    *,
    window: jax.Array,
    softcap: float | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online-softmax ``carry`` (max, denominator ``[Hkv, G, T]``, accumulator ``[Hkv, G, T, D]``) updated with
    every valid token's own sequence's cached keys. ``qh`` ``[Hkv, G, T, D]`` scaled float32 queries; ``plan``:
    the per-sequence page tables ``[S, P']`` padded to whole key blocks (``key_blocks``). The window is
    ``ROW_WINDOW`` rows, read when traced."""
    hkv, g, t, d = qh.shape
    s_count = plan.tables.shape[0]
    size = plan.size
    r = min(ROW_WINDOW, t)
    f32 = jnp.float32
    idx = jnp.arange(t, dtype=jnp.int32)
    start = jax.ops.segment_min(jnp.where(valid, idx, t), token_seq, s_count)  # [S] first row (t: none)
    end = jax.ops.segment_max(jnp.where(valid, idx + 1, 0), token_seq, s_count)  # [S] one past the last row
    windows = jnp.where(end > start, (end - start + r - 1) // r, 0)
    first_block = jnp.where(valid, first_visible_key(positions, window) // size, jnp.iinfo(jnp.int32).max)
    lo = jax.ops.segment_min(first_block, token_seq, s_count)
    hi = (kv_lens + size - 1) // size

    kb = jnp.maximum(hi - jnp.minimum(lo, hi), 0)  # key blocks of each sequence
    from_block = hi - kb
    items = windows * kb  # (window, key block) pairs of each sequence
    ends = jnp.cumsum(items)

    def step(i, carry):
        s = jnp.minimum(jnp.searchsorted(ends, i, side="right"), s_count - 1)
        j = i - (ends[s] - items[s])
        w, b = j // kb[s], from_block[s] + j % kb[s]
        first = start[s] + w * r
        r0 = jnp.minimum(first, t - r)  # the last window is shifted back to fit the step
        at = r0 + jnp.arange(r, dtype=jnp.int32)
        mine = (at >= first) & (at < jnp.minimum(first + r, end[s]))
        mine &= (lax.dynamic_slice_in_dim(token_seq, r0, r) == s) & lax.dynamic_slice_in_dim(valid, r0, r)
        pos = lax.dynamic_slice_in_dim(positions, r0, r)
        q = lax.dynamic_slice_in_dim(qh, r0, r, axis=2)
        table = lax.dynamic_index_in_dim(plan.tables, s, keepdims=False)
        pages = lax.dynamic_slice_in_dim(table, b * plan.pages, plan.pages)
        k = k_pool[pages].reshape(size, hkv, d).astype(f32)
        v = v_pool[pages].reshape(size, hkv, d).astype(f32)
        scores = softcap_scores(jnp.einsum("kgtd,jkd->kgtj", q, k), softcap)
        seen = visible_keys(b, size, jnp.full((r,), kv_lens[s]), pos, window) & mine[:, None]
        scores = jnp.where(seen, scores, MASKED_SCORE)
        state = tuple(lax.dynamic_slice_in_dim(x, r0, r, axis=2) for x in carry)
        new = online_update(state, scores, lambda p: jnp.einsum("kgtj,jkd->kgtd", p, v))
        return tuple(lax.dynamic_update_slice_in_dim(x, y, r0, axis=2) for x, y in zip(carry, new))

    return lax.fori_loop(0, ends[-1], step, carry)


__all__ = ["ROW_WINDOW", "segment_prefix"]
