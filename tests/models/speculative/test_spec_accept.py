"""Tree acceptance: greedy on hand-built logits, jitted == reference on random trees, plain-sampling filter."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.filtering import filtered_logits
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.sampling.penalties import PenaltyTable
from specrag_jax.models.sampling.sampler import sample_tokens
from specrag_jax.models.speculative.accept import accept_tree, accept_trees
from specrag_jax.models.speculative.accept_ref import accept_reference
from specrag_jax.models.speculative.tree import TokenTree, build_tree, stack_trees

V = 50
PROPS = [[5, 6, 7], [5, 6, 9], [3], [8, 1]]


def node(tree: TokenTree, toks: tuple[int, ...]) -> int:
    """Chunk index of the node reached by ``toks`` from the root."""
    u = 0
    for t in toks:
        u = next(c for c in range(1, tree.budget) if tree.valid[c] and tree.parents[c] == u and tree.tokens[c] == t)
    return u


def greedy_logits(tree: TokenTree, argmax: dict[tuple[int, ...], int], seed: int = 0) -> np.ndarray:
    """Random logits whose row for the node at each listed path peaks at the given token."""
    logits = np.random.default_rng(seed).normal(size=(tree.budget, V)).astype(np.float32)
    for toks, tok in argmax.items():
        logits[node(tree, toks), tok] = 10.0
    return logits


greedy_jit = jax.jit(lambda lg, tr: accept_tree(lg, tr, 0.0, 0, 1.0, jax.random.PRNGKey(0), greedy_only=True))
sample_jit = jax.jit(lambda lg, tr, t, k, p, key: accept_tree(lg, tr, t, k, p, key, greedy_only=False))


@pytest.mark.parametrize(
    "argmax,path,emitted",
    [
        ({(): 5, (5,): 6, (5, 6): 9, (5, 6, 9): 4}, [(5,), (5, 6), (5, 6, 9)], [5, 6, 9, 4]),  # to a leaf + bonus
        ({(): 5, (5,): 6, (5, 6): 2, (5, 6, 7): 4}, [(5,), (5, 6)], [5, 6, 2]),  # no child matches: bonus
        ({(): 8, (8,): 2, (8, 1): 1}, [(8,)], [8, 2]),
        ({(): 7, (5,): 6, (3,): 3}, [], [7]),  # the root's argmax is no child: only the bonus
    ],
)
def test_greedy_hand_built(argmax, path, emitted):
    tree = build_tree(PROPS, root_token=42, budget=8)
    logits = greedy_logits(tree, argmax)
    for res in (greedy_jit(logits, tree), sample_jit(logits, tree, 0.0, 0, 1.0, jax.random.PRNGKey(3))):
        n = len(path)
        want_path = [0] + [node(tree, p) for p in path]
        assert int(res.num_accepted) == n
        assert np.asarray(res.path).tolist() == want_path + [-1] * (tree.budget - n - 1)
        assert np.asarray(res.tokens).tolist() == emitted + [-1] * (tree.budget - n - 1)
        lsm = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
        want_lp = [float(lsm[r, t]) for r, t in zip(want_path, emitted)]
        np.testing.assert_allclose(np.asarray(res.logprobs)[: n + 1], want_lp, rtol=1e-6)
        assert not np.asarray(res.logprobs)[n + 1 :].any()


def test_greedy_emits_argmax_at_every_row():
    """Each emitted token is the argmax at the row before it: plain greedy decoding's choice."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        props = [list(rng.integers(0, 4, size=rng.integers(1, 5))) for _ in range(4)]
        tree = build_tree(props, root_token=0, budget=16)
        logits = rng.normal(size=(16, V)).astype(np.float32)
        logits[:, :4] += 3.0  # proposals are often right
        res = greedy_jit(logits, tree)
        n = int(res.num_accepted)
        rows = np.asarray(res.path)[: n + 1]
        assert np.asarray(res.tokens)[: n + 1].tolist() == logits[rows].argmax(-1).tolist()


@pytest.mark.parametrize("top_k,top_p,temp", [(0, 1.0, 1.0), (3, 1.0, 0.7), (0, 0.6, 1.3), (5, 0.8, 0.5)])
def test_filter_mirrors_sample_tokens(top_k, top_p, temp):
    rows = 64
    logits = jax.random.normal(jax.random.PRNGKey(1), (rows, 30)) * 2.0
    t, k, p = jnp.full(rows, temp), jnp.full(rows, top_k, jnp.int32), jnp.full(rows, top_p)
    seeds, steps = jnp.arange(rows, dtype=jnp.int32), jnp.full(rows, 5, jnp.int32)
    batch = SamplingBatch.of([SamplingParams(temp, top_k, top_p)] * rows, [5] * rows)
    batch = dataclasses.replace(batch, seeds=np.arange(rows, dtype=np.uint32))
    want = sample_tokens(logits, batch, PenaltyTable(30, 4, jax.devices()[0]).state, greedy_only=False).ids
    keys = jax.vmap(lambda s, n: jax.random.fold_in(jax.random.PRNGKey(s), n))(seeds, steps)
    got = jax.vmap(jax.random.categorical)(keys, filtered_logits(logits, t, k, p))
    assert np.array_equal(np.asarray(got), np.asarray(want))


@st.composite
def cases(draw):
    vocab = draw(st.sampled_from([4, 8, 16]))
    props = draw(st.lists(st.lists(st.integers(0, vocab - 1), max_size=5), min_size=1, max_size=6))
    budget = draw(st.sampled_from([8, 16]))
    seed = draw(st.integers(0, 2**31 - 1))
    temp = draw(st.sampled_from([0.0, 0.3, 1.0, 2.0]))
    top_k = draw(st.sampled_from([0, 1, 2, 5]))
    top_p = draw(st.sampled_from([1.0, 0.9, 0.5]))
    boost = draw(st.sampled_from([0.0, 2.0, 4.0]))  # raise the proposed tokens: deeper acceptance
    return vocab, props, budget, seed, temp, top_k, top_p, boost


@settings(max_examples=120, deadline=None, derandomize=True)
@given(case=cases())
def test_jitted_equals_reference(case):
    vocab, props, budget, seed, temp, top_k, top_p, boost = case
    rng = np.random.default_rng(seed)
    tree = build_tree(props, root_token=int(rng.integers(vocab)), budget=budget)
    logits = (rng.normal(size=(budget, vocab)) * rng.choice([0.5, 2.0, 5.0])).astype(np.float32)
    nodes = np.flatnonzero(tree.valid)[1:]
    logits[tree.parents[nodes], tree.tokens[nodes]] += boost
    key = jax.random.PRNGKey(seed)
    path, emitted = accept_reference(logits, tree, temp, top_k, top_p, key)
    res = sample_jit(logits, tree, temp, top_k, top_p, key)
    n = len(path) - 1
    assert int(res.num_accepted) == n
    assert np.asarray(res.path)[: n + 1].tolist() == path
    assert np.asarray(res.tokens)[: n + 1].tolist() == emitted
    if temp == 0.0:
        g = greedy_jit(logits, tree)
        assert np.asarray(g.tokens).tolist() == np.asarray(res.tokens).tolist()


def test_batch_equals_one_by_one():
    rng = np.random.default_rng(7)
    s, b, vocab = 6, 16, 12
    trees = [
        build_tree([list(rng.integers(0, 3, size=3)) for _ in range(3)], int(rng.integers(vocab)), b) for _ in range(s)
    ]
    logits = rng.normal(size=(s, b, vocab)).astype(np.float32) * 2.0
    temp = np.array([0.0, 1.0, 0.5, 1.0, 0.0, 2.0], np.float32)
    top_k = np.array([0, 0, 3, 0, 0, 2], np.int32)
    top_p = np.array([1.0, 0.9, 1.0, 1.0, 1.0, 1.0], np.float32)
    keys = jax.random.split(jax.random.PRNGKey(0), s)
    batch = accept_trees(logits, stack_trees(trees), temp, top_k, top_p, keys, greedy_only=False)
    for i in range(s):
        one = sample_jit(logits[i], trees[i], temp[i], top_k[i], top_p[i], keys[i])
        for field in ("path", "num_accepted", "tokens", "logprobs"):
            np.testing.assert_array_equal(np.asarray(getattr(batch, field))[i], np.asarray(getattr(one, field)))
