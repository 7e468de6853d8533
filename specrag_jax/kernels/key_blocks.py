"""Cached keys in blocks: the loop range and the online-softmax update the blocked CPU paths share.

A step's page tables are padded to whole blocks of ``pages_per_block`` pages, and the loop runs over block
indices from the first block any valid token can see (its sliding window's first key) to the block holding the
longest valid prefix's last key, so a bucket's empty tail is never read (``blocked.py``, ``decode_blocked.py``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

KEY_BLOCK = 128  # cached keys per loop step (Qwen2.5 heads, 512 queries over 3,584 keys: 128 92 ms, 256 117, 512 162)


@dataclasses.dataclass(frozen=True)
class KeyBlocks:
    """Loop plan: padded ``tables`` [rows, P'], ``pages`` per block, ``size`` keys per block, range [lo, hi)."""

    tables: jax.Array
    pages: int
    size: int
    lo: jax.Array
    hi: jax.Array


def key_blocks(tables, page_size: int, lens, positions, valid, window, block_tokens: int = KEY_BLOCK) -> KeyBlocks:
    """The blocks a step must read: ``lens`` [T] cached keys each token may see, ``window`` 0 = none."""
    pages = max(1, block_tokens // page_size)
    size = pages * page_size
    # Whole blocks only: a dynamic slice running past the table's end would be shifted back.
    tables = jnp.pad(tables, ((0, 0), (0, -tables.shape[1] % pages)))
    first_key = first_visible_key(positions, window)
    lo = jnp.min(jnp.where(valid, first_key, jnp.iinfo(jnp.int32).max)) // size
    hi = jnp.maximum((jnp.max(jnp.where(valid, lens, 0)) + size - 1) // size, lo)
    return KeyBlocks(tables, pages, size, lo, hi)


def first_visible_key(positions, window) -> jax.Array:
    """[rows] the first key each token may see: its sliding window's start (``window`` 0: key 0)."""
    return jnp.where(window > 0, jnp.maximum(positions - window + 1, 0), 0)


def visible_keys(b, size: int, lens, positions, window) -> jax.Array:
    """[rows, size] bool: which keys of block ``b`` (one index, or one per row) each token sees (before its
    length, inside its window)."""
    key = jnp.reshape(b, (-1, 1)) * size + jnp.arange(size)
    return (key < lens[:, None]) & ((window <= 0) | (positions[:, None] - key < window))


def online_update(carry, scores, values_of):
    """One block's online-softmax step: ``carry`` (max, denominator, accumulator), masked ``scores`` [..., keys],
    ``values_of(p)`` the probabilities times the block's values."""
    m, denom, acc = carry
    m_new = jnp.maximum(m, scores.max(-1))
    p = jnp.exp(scores - m_new[..., None])
    c = jnp.exp(m - m_new)
    return m_new, denom * c + p.sum(-1), acc * c[..., None] + values_of(p)


__all__ = ["KEY_BLOCK", "KeyBlocks", "first_visible_key", "key_blocks", "online_update", "visible_keys"]
