"""The distribution plain sampling draws from: temperature, then top-k, then top-p, per row.

``sampling.sample_tokens`` draws from ``filtered_logits`` (a test also checks that ``categorical`` over it picks
exactly the tokens ``sample_tokens`` picks for the same keys), so speculative sampling targets the very
distribution plain decoding samples from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def filtered_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """[R, V] float32 logits -> temperature-scaled logits with filtered tokens at -inf (rows with T > 0)."""
    vocab = logits.shape[-1]
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    sorted_desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)  # top-k threshold
    ranks = jnp.arange(vocab)[None, :]
    sorted_k = jnp.where(ranks < k[:, None], sorted_desc, -jnp.inf)
    probs = jax.nn.softmax(sorted_k, axis=-1)
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]  # smallest set reaching top_p
    n_keep = jnp.maximum(keep.sum(-1), 1)
    pth = jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)
    threshold = jnp.maximum(kth, pth)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def target_probs(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """[R, V] probabilities plain decoding samples from; a temperature-0 row is one-hot at its argmax."""
    sampled = jax.nn.softmax(filtered_logits(logits, temperature, top_k, top_p), axis=-1)
    greedy = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=sampled.dtype)
    return jnp.where((temperature > 0)[:, None], sampled, greedy)
