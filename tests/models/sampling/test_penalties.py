"""Penalties and log-probabilities of the jitted sampler against a numpy reference on the same logits."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.params import MAX_TOP_LOGPROBS, SamplingParams
from specrag_jax.models.sampling.penalties import PenaltyTable, penalize, penalize_tree
from specrag_jax.models.sampling.sampler import sample_tokens
from specrag_jax.models.speculative.tree import build_tree, stack_trees

V = 40


def penalize_ref(logits, prompt, out, presence, frequency, repetition):
    """vLLM / HF semantics: repetition over prompt + output, then frequency and presence over the output."""
    x = np.array(logits, np.float32)
    counts = np.bincount(np.asarray(out, int), minlength=V).astype(np.float32)
    seen = counts > 0
    seen[list(prompt)] = True
    rep = np.float32(repetition)
    x = np.where(seen, np.where(x > 0, x / rep, x * rep), x)
    return x - np.float32(frequency) * counts - np.float32(presence) * (counts > 0)


def log_softmax_ref(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def table_with(rows):
    """A penalty table whose slot i+1 holds rows[i] = (prompt, generated tokens), counted through ``record``."""
    table = PenaltyTable(V, 16, jax.devices()[0], num_slots=len(rows))
    slots = [table.acquire(prompt) for prompt, _ in rows]
    for k in range(max(len(out) for _, out in rows)):
        ids = [out[k] if k < len(out) else 0 for _, out in rows]
        live = [s if k < len(out) else 0 for s, (_, out) in zip(slots, rows)]
        table.record(np.asarray(live, np.int32), jax.device_put(np.asarray(ids, np.int32)))
    return table, slots


logit_values = st.one_of(
    st.floats(-30, 30, width=32, allow_subnormal=False), st.sampled_from([0.0, -0.0, 1e-30, -1e-30, 1e4, -1e4])
)
tokens = st.lists(st.integers(0, V - 1), max_size=12)
penalty = st.one_of(st.floats(-2, 2, width=32, allow_subnormal=False), st.sampled_from([0.0, -2.0, 2.0]))
repetition = st.one_of(st.floats(0.125, 10, width=32, allow_subnormal=False), st.sampled_from([1.0, 0.5, 2.0]))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(logit_values, min_size=V, max_size=V),
            st.lists(st.integers(0, V - 1), max_size=16),
            tokens,
            penalty,
            penalty,
            repetition,
        ),
        min_size=1,
        max_size=3,
    )
)
def test_penalties_equal_numpy_reference(rows):
    table, slots = table_with([(prompt, out) for _, prompt, out, *_ in rows])
    params = [SamplingParams(presence_penalty=p, frequency_penalty=f, repetition_penalty=r) for *_, p, f, r in rows]
    batch = SamplingBatch.of(params, [0] * len(rows), slots)
    logits = np.asarray([lg for lg, *_ in rows], np.float32)
    got = np.asarray(jax.jit(penalize)(logits, batch, table.state))
    for i, (lg, prompt, out, p, f, r) in enumerate(rows):
        np.testing.assert_allclose(got[i], penalize_ref(lg, prompt, out, p, f, r), rtol=1e-6, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    tokens,
    tokens,
    penalty,
    penalty,
    repetition,
    st.integers(1, MAX_TOP_LOGPROBS),
    st.booleans(),
)
def test_sampler_logprobs_are_the_penalised_distribution(seed, prompt, out, p, f, r, n, greedy):
    """The chosen token, its log-probability and the top alternatives follow the penalised logits."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((2, V)) * 4).astype(np.float32)
    table, slots = table_with([(prompt, out), ([], [])])
    sp = SamplingParams(
        0.0 if greedy else 0.8, seed=seed, presence_penalty=p, frequency_penalty=f, repetition_penalty=r, top_logprobs=n
    )
    batch = SamplingBatch.of([sp, SamplingParams(top_logprobs=n)], [len(out), 0], [slots[0], 0])
    res = jax.jit(sample_tokens, static_argnames="greedy_only")(logits, batch, table.state, greedy_only=greedy)
    for i, want_logits in enumerate([penalize_ref(logits[0], prompt, out, p, f, r), logits[1]]):
        ref = log_softmax_ref(want_logits)
        if greedy or i == 1:
            assert int(res.ids[i]) == int(np.argmax(want_logits))
        np.testing.assert_allclose(float(res.logprobs[i]), ref[int(res.ids[i])], atol=1e-4)
        order = np.argsort(-ref, kind="stable")[:MAX_TOP_LOGPROBS]
        np.testing.assert_allclose(np.asarray(res.top_logprobs[i]), ref[order], atol=1e-4)
        assert np.allclose(ref[np.asarray(res.top_ids[i])], ref[order], atol=1e-4)  # ties may swap ids


def test_no_penalty_rows_are_the_old_path_bit_for_bit():
    """Rows without penalties give identical bits whether or not another row of the step is penalised."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((4, V)) * 3).astype(np.float32)
    logits[1, :5] = [0.0, -0.0, 1e-38, -1e-38, 7.0]
    table, slots = table_with([([1, 2, 3], [4, 4, 5])])
    plain = [SamplingParams(0.7, seed=s, top_logprobs=3) for s in range(3)]
    penal = SamplingParams(0.7, seed=9, presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.3)
    fn = jax.jit(sample_tokens, static_argnames="greedy_only")
    alone = fn(logits[1:], SamplingBatch.of(plain, [2] * 3), table.state, greedy_only=False)
    mixed = fn(logits, SamplingBatch.of([penal] + plain, [2] * 4, [slots[0], 0, 0, 0]), table.state, greedy_only=False)
    for a, m in zip(alone, mixed):
        assert np.array_equal(np.asarray(a), np.asarray(m)[1:])
    assert not np.array_equal(
        np.asarray(mixed.logprobs)[:1],
        np.asarray(fn(logits[:1], SamplingBatch.of([penal], [2]), table.state, greedy_only=False).logprobs),
    )  # penalised


def test_slots_are_reused_clean_and_bounded():
    table, (slot,) = table_with([([3, 4], [5, 5, 6])])
    table.release(slot)
    again = table.acquire([7])
    batch = SamplingBatch.of([SamplingParams(presence_penalty=1.0, repetition_penalty=2.0)], [0], [again])
    got = np.asarray(penalize(np.ones((1, V), np.float32), batch, table.state))[0]
    want = penalize_ref(np.ones(V), [7], [], 1.0, 0.0, 2.0)
    np.testing.assert_array_equal(got, want)  # the old prompt's and output's marks are gone
    with pytest.raises(SpecRagError, match="penalty slots are in use"):
        table.acquire([1])
    with pytest.raises(SpecRagError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)
    with pytest.raises(SpecRagError, match="top_logprobs"):
        SamplingParams(top_logprobs=MAX_TOP_LOGPROBS + 1)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=4), min_size=1, max_size=3),
    tokens,
    tokens,
    penalty,
    penalty,
    repetition,
)
def test_tree_nodes_are_penalised_as_plain_decoding_after_their_path(props, prompt, out, p, f, r):
    tree = build_tree(props, out[-1] if out else 1, 16, vocab_size=V)
    table, slots = table_with([(prompt, out)])
    batch = SamplingBatch.of(
        [SamplingParams(presence_penalty=p, frequency_penalty=f, repetition_penalty=r)], [0], slots
    )
    logits = np.random.default_rng(len(out)).standard_normal((1, 16, V)).astype(np.float32) * 5
    trees = stack_trees([tree])
    got = np.asarray(jax.jit(penalize_tree)(logits, trees.tokens, trees.parents, batch, table.state))[0]
    parents, toks = np.asarray(tree.parents), np.asarray(tree.tokens)
    for c in range(1, tree.num_tokens):  # the root's row: the counts alone
        path, node = [], c
        while node > 0:
            path.append(int(toks[node]))
            node = int(parents[node])
        want = penalize_ref(logits[0, c], prompt, list(out) + path[::-1], p, f, r)
        np.testing.assert_allclose(got[c], want, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got[0], penalize_ref(logits[0, 0], prompt, out, p, f, r), rtol=1e-6, atol=1e-5)
