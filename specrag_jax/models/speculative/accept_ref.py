"""Reference acceptance, written straight from the algorithm (Python loops; ground truth for tests).

Same randomness as ``accept`` (``draw_uniforms``: node c's coin is ``coins[c]``), but the residual is
kept as a vector and renormalised explicitly: reject x -> p(x) = 0, p /= sum(p). Children are found by
scanning ``parents`` (not the tree's sibling links), so the links are checked too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.models.sampling.filtering import target_probs
from specrag_jax.models.speculative.accept import draw_uniforms
from specrag_jax.models.speculative.tree import TokenTree


def accept_reference(
    logits: np.ndarray, tree: TokenTree, temperature: float, top_k: int, top_p: float, key: jax.Array
) -> tuple[list[int], list[int]]:
    """(accepted path of chunk indices, starting with the root 0; emitted tokens incl. the bonus)."""
    b = logits.shape[0]
    probs = np.asarray(
        target_probs(
            jnp.asarray(logits, jnp.float32),
            jnp.full(b, temperature, jnp.float32),
            jnp.full(b, top_k, jnp.int32),
            jnp.full(b, top_p, jnp.float32),
        )
    )
    coins, final_key = draw_uniforms(key, b)
    return reference_from_probs(probs, tree, np.asarray(coins), final_key)


def reference_from_probs(
    probs: np.ndarray, tree: TokenTree, coins: np.ndarray, final_key: jax.Array
) -> tuple[list[int], list[int]]:
    """The walk itself on target probabilities [B, V] (one-hot rows = greedy)."""
    parents, tokens, valid = (np.asarray(x) for x in (tree.parents, tree.tokens, tree.valid))
    path, emitted = [0], []
    u = 0
    q = probs[0].astype(np.float64)
    while True:
        accepted = None
        for c in range(1, len(tokens)):
            if not (valid[c] and parents[c] == u):
                continue
            x = int(tokens[c])
            if float(coins[c]) < q[x] / q.sum():
                accepted = c
                break
            q[x] = 0.0
        if accepted is None:
            break
        u = accepted
        path.append(u)
        emitted.append(int(tokens[u]))
        q = probs[u].astype(np.float64)
    if q.sum() <= 0:
        q = probs[u].astype(np.float64)
    residual = jnp.asarray(q, jnp.float32)
    emitted.append(int(jax.random.categorical(final_key, jnp.log(residual))))
    return path, emitted
