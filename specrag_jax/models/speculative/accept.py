"""Acceptance of a verified token tree: greedy-exact and sampling-lossless, jitted on fixed shapes.

Input: a ``TokenTree`` chunk ``[B]`` (``tree``; index 0 = root = the last accepted, not yet fed token)
and the verifier's logits at every chunk row ``[B, V]`` (row c = distribution of the token after c).

Walk (one ``fori_loop`` of B - 1 steps; each step tries one candidate child, every node is tried at most
once): start at the root; at node u try its children in chunk order. Greedy accepts the child whose token is
the argmax of row u. Sampling (multi-draft speculative sampling with one-hot drafts) draws r ~ U(0, 1) per
child and accepts x if ``r * remaining < p_u(x)``, where ``remaining`` is 1 minus the mass of u's children
rejected so far, i.e. p_u with those tokens zeroed, renormalised. On acceptance the walk moves to the child
(``remaining = 1``). When u has no (further) child the bonus token is the argmax of row u (greedy) or a
sample of p_u with all of u's children zeroed (sampling; they were all rejected, or u is a leaf).

Lossless only if siblings are distinct (``build_tree`` guarantees it): the scalar ``remaining`` counts a
duplicated sibling twice otherwise (a test shows the bias), and the tree must be fixed before the coins.
Every child is accepted with probability exactly p_u(x) whatever the sibling order.

Coins: ``draw_uniforms(key, B)`` gives one uniform per chunk index (the coin of the node tried there) and
the key of the final sample, so the reference (``accept_ref``) consumes identical randomness.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specrag_jax.models.sampling.filtering import target_probs
from specrag_jax.models.speculative.tree import TokenTree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AcceptResult:
    """One step's outcome (``[B]`` arrays; batched: a leading ``[S]``)."""

    path: jax.Array  # chunk indices whose K/V to keep: path[0] = 0 (root), path[1..n] = accepted, then -1
    num_accepted: jax.Array  # n: accepted proposed tokens (0 .. tree depth)
    tokens: jax.Array  # emitted tokens: tokens[path[1..n]], then the bonus at index n, then -1
    logprobs: jax.Array  # model log-prob (unfiltered log-softmax of row path[k]) of tokens[k]; 0 after


def draw_uniforms(key: jax.Array, budget: int) -> tuple[jax.Array, jax.Array]:
    """(coins [budget] in [0, 1), key of the final sample) from one step key."""
    coin_key, final_key = jax.random.split(key)
    return jax.random.uniform(coin_key, (budget,)), final_key


def tree_walk(
    child_prob: jax.Array, first_child: jax.Array, next_sibling: jax.Array, coins: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Accepted path [B], its length n (accepted nodes) and the node where the walk stopped.

    ``child_prob[c]`` = target probability of node c's token at its parent (1/0 for greedy).
    """
    b = child_prob.shape[0]

    def body(_, state):
        u, c, remaining, n, path = state
        cc = jnp.maximum(c, 0)
        prob = child_prob[cc]
        acc = (c >= 0) & (coins[cc] * remaining < prob)
        rej = (c >= 0) & ~acc
        slot = jnp.minimum(n + 1, b - 1)
        path = path.at[slot].set(jnp.where(acc, cc, path[slot]))
        u = jnp.where(acc, cc, u)
        remaining = jnp.where(acc, 1.0, jnp.where(rej, remaining - prob, remaining))
        c = jnp.where(acc, first_child[cc], jnp.where(rej, next_sibling[cc], c))
        return u, c, remaining, n + acc.astype(jnp.int32), path

    path0 = jnp.full(b, -1, jnp.int32).at[0].set(0)
    state = (jnp.int32(0), first_child[0], jnp.float32(1.0), jnp.int32(0), path0)
    last, _, _, n, path = jax.lax.fori_loop(0, b - 1, body, state)
    return path, n, last


def accept_from_probs(
    probs: jax.Array, tree: TokenTree, coins: jax.Array, final_key: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sampling acceptance against target probabilities ``probs`` [B, V]: (path, n, emitted tokens)."""
    vocab = probs.shape[-1]
    has_parent = tree.valid & (tree.parents >= 0)
    child_prob = jnp.where(has_parent, probs[jnp.maximum(tree.parents, 0), tree.tokens], 0.0)
    path, n, last = tree_walk(child_prob, tree.first_child, tree.next_sibling, coins)
    children = jnp.where(has_parent & (tree.parents == last), tree.tokens, vocab)
    residual = probs[last].at[children].set(0.0, mode="drop")
    residual = jnp.where(residual.sum() > 0, residual, probs[last])  # rounding left no mass: plain p
    bonus = jax.random.categorical(final_key, jnp.log(residual)).astype(jnp.int32)
    return path, n, _emitted(tree, path, n, bonus)


def accept_greedy_ids(argmax_ids: jax.Array, tree: TokenTree) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Greedy acceptance from the verifier's argmax at every row ``[B]``: (path, n, emitted tokens)."""
    has_parent = tree.valid & (tree.parents >= 0)
    match = has_parent & (tree.tokens == argmax_ids[jnp.maximum(tree.parents, 0)])
    coins = jnp.zeros(tree.tokens.shape, jnp.float32)
    path, n, last = tree_walk(match.astype(jnp.float32), tree.first_child, tree.next_sibling, coins)
    return path, n, _emitted(tree, path, n, argmax_ids[last].astype(jnp.int32))


def accept_tree(
    logits: jax.Array,
    tree: TokenTree,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    key: jax.Array,
    *,
    greedy_only: bool,
) -> AcceptResult:
    """One sequence: float32 ``logits`` [B, V], scalar sampling parameters (temperature 0 = greedy)."""
    b = logits.shape[0]
    if greedy_only:
        path, n, tokens = accept_greedy_ids(jnp.argmax(logits, axis=-1), tree)
    else:
        row = lambda x, dtype: jnp.broadcast_to(jnp.asarray(x, dtype), (b,))  # noqa: E731
        probs = target_probs(logits, row(temperature, jnp.float32), row(top_k, jnp.int32), row(top_p, jnp.float32))
        path, n, tokens = accept_from_probs(probs, tree, *draw_uniforms(key, b))
    k = jnp.arange(b)
    rows = jnp.maximum(path, 0)
    lp = jax.nn.log_softmax(logits, axis=-1)[rows, jnp.maximum(tokens, 0)]
    return AcceptResult(path, n, tokens, jnp.where(k <= n, lp, 0.0))


@functools.partial(jax.jit, static_argnames="greedy_only")
def accept_trees(
    logits: jax.Array,
    trees: TokenTree,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    keys: jax.Array,
    *,
    greedy_only: bool,
) -> AcceptResult:
    """Batched ``accept_tree``: logits [S, B, V], stacked trees [S, B], per-row params and keys [S].

    Per-row keys as ``sample_tokens`` derives them, ``fold_in(PRNGKey(seed), step)``, keep a sequence's
    randomness independent of its batch.
    """
    one = functools.partial(accept_tree, greedy_only=greedy_only)
    return jax.vmap(one)(logits, trees, temperature, top_k, top_p, keys)


def _emitted(tree: TokenTree, path: jax.Array, n: jax.Array, bonus: jax.Array) -> jax.Array:
    k = jnp.arange(path.shape[0])
    node = path[jnp.minimum(k + 1, path.shape[0] - 1)]
    return jnp.where(k < n, tree.tokens[jnp.maximum(node, 0)], jnp.where(k == n, bonus, -1)).astype(jnp.int32)
