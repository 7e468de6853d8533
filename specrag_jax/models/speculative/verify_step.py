"""One speculative verification step on device: tree forward pass, acceptance and K/V compaction, fused.

The step's packed tokens are ``S`` token-tree chunks of ``B`` tokens each, laid out back to back (sequence s
owns packed rows ``s * B .. s * B + B - 1``; ``tree`` layout: row 0 = the root, the last accepted token
not yet fed). The decoder writes every chunk token's K/V at its sequence's logical slot ``kv_len + c`` and
returns hidden states; the verifier's logits at all ``S * B`` rows feed ``accept.accept_trees``; then
the accepted path's K/V is moved into contiguous slots: node ``path[k]`` -> logical slot ``kv_len + k``
(k = 1..n; ``path[k] >= k`` because a node's chunk index is at least its depth, and the root is already in
place). The sequence's new length is ``kv_len + n + 1``; slots past it (rejected branches, padding) are never
read before a later step overwrites them, so nothing else is cleared. Only the acceptance outcome
(``[S, B]`` int32/float32) leaves the device.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.kernels import KVPool
from specrag_jax.models.decoder.transformer import Decoder, logits_at
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.penalties import PenaltyState, penalized_tree_logits
from specrag_jax.models.sampling.sampler import top_logprobs
from specrag_jax.models.speculative.accept import accept_trees
from specrag_jax.models.speculative.tree import PADDING, TokenTree


def compact_accepted(pool: KVPool, slots: jax.Array, path: jax.Array) -> KVPool:
    """Copy, in every layer, the K/V of each accepted node to its contiguous slot.

    ``slots`` [S, B]: flat pool slot of chunk index c of sequence s (out of range = not written, e.g. padded
    sequences); ``path`` [S, B] from the acceptance (-1 after the accepted nodes). Indexes pages and offsets
    of the 4-D layer arrays directly: a scatter through a flattened view makes XLA copy the whole pool.
    """
    num_pages, page_size = pool.k[0].shape[:2]
    num_slots = num_pages * page_size
    k = jnp.arange(path.shape[1])[None, :]
    src = jnp.take_along_axis(slots, jnp.maximum(path, 0), axis=1)
    move = (k >= 1) & (path >= 0) & (src < num_slots) & (slots < num_slots)
    src = jnp.where(move, src, 0).reshape(-1)
    dst = jnp.where(move, slots, num_slots).reshape(-1)  # page num_pages: out of range, dropped

    def moved(layer: jax.Array) -> jax.Array:
        rows = layer[src // page_size, src % page_size]
        return layer.at[dst // page_size, dst % page_size].set(rows, mode="drop")

    return KVPool(k=tuple(moved(x) for x in pool.k), v=tuple(moved(x) for x in pool.v))


def speculate_body(
    params,
    pool,
    tokens,
    meta,
    trees: TokenTree,
    batch: SamplingBatch,
    penalties: PenaltyState,
    *,
    cfg,
    impl,
    tree,
    decode,
    greedy_only,
    dtype,
    attention_mesh=None,
):
    """Forward the packed trees, accept per sequence, compact the K/V:
    ``(path, n, tokens, logprobs, top_ids, top_logprobs, pool)``; ``top_*[s, k]``: the most likely tokens at the
    row that emitted ``tokens[s, k]`` (the verifier's own distribution, as plain decoding reports it)."""
    extra = {} if attention_mesh is None else {"attention_mesh": attention_mesh}
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree, decode, **extra).apply(
        {"params": params}, tokens, meta, pool
    )
    s, b = trees.tokens.shape
    logits = logits_at(params, cfg, hidden[: s * b]).reshape(s, b, -1).astype(jnp.float32)
    logits = penalized_tree_logits(logits, trees.tokens, trees.parents, batch, penalties)  # each node as plain
    keys = jax.vmap(lambda seed, step: jax.random.fold_in(jax.random.PRNGKey(seed), step))(batch.seeds, batch.steps)
    result = accept_trees(logits, trees, batch.temperature, batch.top_k, batch.top_p, keys, greedy_only=greedy_only)
    pool = compact_accepted(pool, meta.write_slots[: s * b].reshape(s, b), result.path)
    rows = jnp.maximum(result.path, 0)[:, :, None]  # the row that emitted tokens[k]
    top_ids, top_lps = top_logprobs(
        logits, batch.top_n, lambda x: jax.nn.log_softmax(jnp.take_along_axis(x, rows, axis=1), axis=-1)
    )
    return result.path, result.num_accepted, result.tokens, result.logprobs, top_ids, top_lps, pool


def pad_trees(trees: TokenTree, num_seqs: int) -> TokenTree:
    """Stacked trees [S, B] padded to [num_seqs, B] with empty trees (a padded sequence accepts nothing)."""
    extra = num_seqs - trees.tokens.shape[0]
    if extra <= 0:
        return trees

    def grow(name: str) -> np.ndarray:
        a = np.asarray(getattr(trees, name))
        return np.concatenate([a, np.full((extra,) + a.shape[1:], PADDING[name], a.dtype)])

    return TokenTree(**{f.name: grow(f.name) for f in dataclasses.fields(TokenTree)})
