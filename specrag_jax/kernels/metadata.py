"""Attention metadata: the one contract shared by prefill, decode and tree verification (DESIGN.md §3).

A step processes ``T`` packed query tokens belonging to ``S`` sequences. Each sequence has a page-table row
and ``kv_lens[s]`` tokens already cached in the page pool (its *prefix*). The step's own tokens form, per
sequence, one *chunk*; inside a chunk a token sees its ancestors (``parents``; -1 means it attaches
directly to the cached prefix) and itself. A plain causal chunk is ``parents[i] = i - 1``.

Key/value storage slot of a chunk token: ``token_slot`` (an index into its sequence's logical KV, normally
``kv_lens[s] + rank in chunk``). Prefix key ``j`` of sequence ``s`` has position ``j``; chunk tokens carry
their own ``positions`` (tree branches restart their positions at the prefix length).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Per-step structure; every field is an int32/bool array (padding tokens have ``token_valid=False``)."""

    token_seq: jax.Array  # [T] sequence row of each packed token
    positions: jax.Array  # [T] RoPE position of each token
    parents: jax.Array  # [T] packed index of the parent token, -1 = attaches to the cached prefix
    token_valid: jax.Array  # [T] False for bucket padding
    write_slots: jax.Array  # [T] flat pool slot (page * page_size + offset) to store K/V; out of range = drop
    page_table: jax.Array  # [S, P] page ids of each sequence
    kv_lens: jax.Array  # [S] cached tokens before this step
    # Derived, optional: [T, T] bool ancestor-or-self mask of the chunk tokens (``ancestor_mask(parents)``).
    # The model computes it once per step so its layers do not each rebuild it; None = compute on demand.
    ancestors: jax.Array | None = None

    def with_ancestors(self) -> "AttentionMetadata":
        """A copy carrying the precomputed ancestor mask (a no-op when already present)."""
        if self.ancestors is not None:
            return self
        return dataclasses.replace(self, ancestors=ancestor_mask(self.parents))

    @property
    def num_tokens(self) -> int:
        return int(self.token_seq.shape[0])


def ancestor_mask(parents: jax.Array) -> jax.Array:
    """[T, T] bool: ``m[i, j]`` is True when token j is token i or one of its ancestors.

    Pointer doubling: log2(T) rounds of set union along ever longer jumps; no Python loop over tokens.
    """
    t = parents.shape[0]
    idx = jnp.arange(t)
    mask = idx[:, None] == idx[None, :]
    jump = jnp.where(parents < 0, idx, parents)  # roots jump to themselves
    for _ in range(max(1, int(np.ceil(np.log2(max(t, 2)))))):
        mask = mask | mask[jump]
        jump = jump[jump]
    # One more union so the ancestors reached by the last jump are included.
    return mask | mask[jump]


def chain_parents(num_tokens: int, start: int = 0) -> np.ndarray:
    """Parents of a causal chain of ``num_tokens`` packed at ``start`` (first token attaches to the prefix)."""
    return np.concatenate([[-1], np.arange(start, start + num_tokens - 1)]).astype(np.int32)[:num_tokens]
