"""The fused speculation step against plain references: K/V compaction (numpy) and the whole step (tree
logits from ``ModelRunner.logits`` + the Python acceptance reference), on random trees (hypothesis)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.kernels import make_pool
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.accept_ref import accept_reference
from specrag_jax.models.speculative.tree import build_tree, stack_trees
from specrag_jax.models.speculative.verify_step import compact_accepted, pad_trees


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data(), seqs=st.integers(1, 3), budget=st.sampled_from([4, 8]), page_size=st.sampled_from([1, 2, 3]))
def test_compaction_equals_numpy_reference(data, seqs, budget, page_size):
    num_pages = 1 + seqs * (budget + page_size) // page_size + 2
    pool = make_pool(2, num_pages, page_size, 1, 2)
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    pool = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype), pool)
    num_slots = num_pages * page_size
    slots = rng.permutation(np.arange(page_size, num_slots))[: seqs * budget].reshape(seqs, budget)
    if data.draw(st.booleans()):
        slots[-1] = num_slots  # a padded sequence: nothing written, nothing moved
    paths = np.full((seqs, budget), -1, np.int32)
    for s in range(seqs):  # an increasing path 0 < p1 < p2 ... (chunk index >= depth)
        n = data.draw(st.integers(0, budget - 1))
        paths[s, : n + 1] = [0] + sorted(rng.choice(np.arange(1, budget), n, replace=False).tolist())
    want = [np.asarray(a).reshape(num_slots, -1).copy() for a in pool.k + pool.v]
    for flat in want:
        before = flat.copy()
        for s in range(seqs):
            for k in range(1, budget):
                if paths[s, k] >= 0 and slots[s, k] < num_slots and slots[s, paths[s, k]] < num_slots:
                    flat[slots[s, k]] = before[slots[s, paths[s, k]]]
    got = compact_accepted(pool, jnp.asarray(slots, jnp.int32), jnp.asarray(paths))
    for a, b in zip(got.k + got.v, want):
        np.testing.assert_array_equal(np.asarray(a).reshape(num_slots, -1), b)


@pytest.fixture(scope="module")
def tiny_runner():
    cfg = tiny_config("llama")
    return ModelRunner(cfg, init_params(cfg, seed=2), num_pages=96, page_size=4, max_seq_len=128)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data(), temperature=st.sampled_from([0.0, 0.8, 1.5]))
def test_speculate_step_equals_logits_plus_reference_acceptance(tiny_runner, data, temperature):
    """Two sequences' random trees in one step: the step's acceptance equals the reference walk on the
    tree logits of a separate (non-writing) pass, and padding to more sequences changes nothing."""
    r = tiny_runner
    budget = 8
    prompts = [data.draw(st.lists(st.integers(3, 96), min_size=1, max_size=9)) for _ in range(2)]
    proposals = [
        data.draw(st.lists(st.lists(st.integers(3, 12), min_size=1, max_size=4), max_size=4)) for _ in range(2)
    ]
    pages, trees, chunks = [], [], []
    for p, props in zip(prompts, proposals):
        pg = r.allocator.allocate(-(-(len(p) + budget) // r.page_size))
        pages.append(pg)
        r.score(r.pack([Chunk(pg, 0, p, rows=[len(p) - 1])]), [0])
        tree = build_tree(props, p[-1], budget)
        trees.append(tree)
        chunks.append(Chunk(pg, len(p), tree.tokens, parents=tree.parents, positions=tree.positions(len(p))))
    try:
        want = []
        for i, (p, tree) in enumerate(zip(prompts, trees)):
            logits = r.logits(
                r.pack(
                    [
                        Chunk(
                            pages[i],
                            len(p),
                            tree.tokens,
                            parents=tree.parents,
                            positions=tree.positions(len(p)),
                            write=False,
                            rows=list(range(budget)),
                        )
                    ]
                )
            )
            key = jax.random.fold_in(jax.random.PRNGKey(7 + i), 3)
            want.append(accept_reference(logits, tree, temperature, 0, 1.0, key))
        width = 4 if data.draw(st.booleans()) else 2  # padded sequences accept nothing and change nothing
        step = r.pack(chunks, token_bucket=width * budget, min_seqs=width)
        rows = SamplingBatch.of([SamplingParams(temperature, seed=7), SamplingParams(temperature, seed=8)], [3, 3])
        path, n, tokens, *_ = r.speculate(step, stack_trees(trees), rows)
        for i, (wpath, wtokens) in enumerate(want):
            assert path[i, : n[i] + 1].tolist() == wpath
            if temperature == 0.0:
                assert tokens[i, : n[i] + 1].tolist() == wtokens
            else:
                assert tokens[i, : n[i]].tolist() == wtokens[:-1]  # the bonus is a categorical draw
    finally:
        for pg in pages:
            r.allocator.release(pg)
    assert r.allocator.num_free == r.allocator.num_usable


def test_pad_trees_adds_empty_trees():
    tree = build_tree([[5, 6]], 4, 8)
    padded = pad_trees(stack_trees([tree]), 4)
    assert padded.tokens.shape == (4, 8) and not padded.valid[1:].any()
    assert (padded.first_child[1:] == -1).all()
