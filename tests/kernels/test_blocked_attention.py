"""The blocked attention (the CPU path: key blocks, query blocks for long steps) against the reference and brute
force."""

from __future__ import annotations

import functools
from unittest import mock

import jax
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import paged_tree_attention_blocked, paged_tree_attention_reference, prefix_segments
from specrag_jax.kernels.blocked import DEFAULT_BLOCK
from specrag_jax.kernels.reference import prefix_gather_mode
from specrag_jax.models.executor.packing import Chunk, pack_chunks, token_count_bucket, token_count_buckets
from tests.kernels.test_reference_attention import brute_force, random_case, to_meta


def jitted(fn, **static):
    """``fn`` with its keyword options fixed, compiled as one program (eager dispatch compiles op by op, per shape)."""
    return jax.jit(functools.partial(fn, **static))


def assert_blocked_equal(rng, k_pool, v_pool, seqs, total, pad, hq, hkv, d, *, block, key_block, **kw):
    """Random queries and step keys for ``seqs`` plus ``pad`` padding rows: the blocked path equals the reference
    and float64 brute force, and padding rows are zero."""
    t_pad = total + pad
    q = rng.normal(size=(t_pad, hq, d)).astype(np.float32) * 3  # sharp softmaxes too
    k_new = rng.normal(size=(t_pad, hkv, d)).astype(np.float32)
    v_new = rng.normal(size=(t_pad, hkv, d)).astype(np.float32)
    meta = to_meta(seqs, t_pad, k_pool.shape[1], k_pool.shape[0])
    args = (q, k_new, v_new, k_pool, v_pool, meta)
    got = np.asarray(jitted(paged_tree_attention_blocked, block=block, key_block=key_block, **kw)(*args))
    ref = np.asarray(jitted(paged_tree_attention_reference, **kw)(*args))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)
    want = brute_force(q, k_new, v_new, k_pool, v_pool, seqs, kw["scale"], kw["window"], kw["softcap"])
    np.testing.assert_allclose(got[:total], want[:total], atol=2e-5, rtol=1e-5)
    assert np.all(got[total:] == 0)


@settings(max_examples=12, deadline=None)  # each example compiles: 25 took 103 s of the cold suite
@given(
    seed=st.integers(0, 2**31 - 1),
    block=st.sampled_from([1, 3, 4, 8]),
    key_block=st.sampled_from([1, 4, 256]),
    ps=st.sampled_from([1, 4, 16]),
    tree=st.booleans(),
    window=st.sampled_from([0, 1, 3, 8]),
    softcap=st.sampled_from([None, 5.0]),
    heads=st.sampled_from([(4, 1), (4, 2), (3, 3)]),
    pad=st.integers(0, 5),
)
def test_blocked_matches_reference_and_brute_force(seed, block, key_block, ps, tree, window, softcap, heads, pad):
    """One sequence (the blocked path's case), blocks that do and do not divide the step, padding rows."""
    rng = np.random.default_rng(seed)
    hq, hkv = heads
    d = 8
    k_pool, v_pool, seqs, total = random_case(rng, 1, 12, 20, ps, hq, hkv, d, tree)
    kw = dict(scale=0.3, window=window, softcap=softcap, tree=tree, block=block, key_block=key_block)
    assert_blocked_equal(rng, k_pool, v_pool, seqs, total, pad, hq, hkv, d, **kw)


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_seqs=st.integers(2, 4),
    key_block=st.sampled_from([1, 4, 8, 256]),
    ps=st.sampled_from([1, 4]),
    tree=st.booleans(),
    window=st.sampled_from([0, 2, 7]),
    pad=st.integers(0, 3),
)
def test_several_sequences_in_key_blocks(seed, n_seqs, key_block, ps, tree, window, pad):
    """Several sequences (prefixes of different lengths, some empty) read their pages in key blocks."""
    rng = np.random.default_rng(seed)
    k_pool, v_pool, seqs, total = random_case(rng, n_seqs, 20, 6, ps, 4, 2, 8, tree)
    kw = dict(scale=0.5, window=window, softcap=None, tree=tree, block=DEFAULT_BLOCK, key_block=key_block)
    assert_blocked_equal(rng, k_pool, v_pool, seqs, total, pad, 4, 2, 8, **kw)


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_seqs=st.integers(2, 5),
    key_block=st.sampled_from([1, 4, 256]),
    rows=st.sampled_from([1, 3, 8, 128]),
    ps=st.sampled_from([1, 4]),
    tree=st.booleans(),
    window=st.sampled_from([0, 2, 7]),
    pad=st.integers(0, 3),
)
def test_several_sequences_read_their_prefixes_sequence_by_sequence(
    seed, n_seqs, key_block, rows, ps, tree, window, pad
):
    """Wide heads make reading each sequence's key blocks the cheaper prefix read (``prefix_segments``): windows of
    1-8 rows, so a sequence takes one or several windows and the last one shifted back over covered rows (128: a
    step under one window keeps the one-hot read)."""
    rng = np.random.default_rng(seed)
    hq, hkv, d = 4, 2, 64
    k_pool, v_pool, seqs, total = random_case(rng, n_seqs, 20, 20, ps, hq, hkv, d, tree)
    assume(prefix_gather_mode(total + pad, n_seqs, hkv, hq // hkv, d) == "per_sequence")
    kw = dict(scale=0.2, window=window, softcap=None, tree=tree, block=DEFAULT_BLOCK, key_block=key_block)
    with mock.patch.object(prefix_segments, "ROW_WINDOW", rows):
        assert_blocked_equal(rng, k_pool, v_pool, seqs, total, pad, hq, hkv, d, **kw)


@pytest.mark.parametrize("pad", [0, 2])
def test_a_window_shifted_back_to_fit_the_step_adds_its_rows_once(pad):
    """The last sequence's tokens end the step (no padding after them, or two rows): its last window of 8 rows
    starts before its share, over rows an earlier window already read (masked there, else counted twice)."""
    rng = np.random.default_rng(7)
    ps, hq, hkv, d = 4, 4, 2, 64
    chunks, prefixes = [5, 13], [9, 17]
    n_pages = 1 + sum(-(-(p + n) // ps) for p, n in zip(prefixes, chunks))
    k_pool = rng.normal(size=(n_pages, ps, hkv, d)).astype(np.float32)
    v_pool = rng.normal(size=(n_pages, ps, hkv, d)).astype(np.float32)
    free, seqs, packed = list(range(1, n_pages)), [], 0
    for kv_len, n in zip(prefixes, chunks):
        pages = [free.pop() for _ in range(-(-(kv_len + n) // ps))]
        seqs.append(
            dict(kv_len=kv_len, pages=pages, parents=list(range(-1, n - 1)), tokens=list(range(packed, packed + n)))
        )
        seqs[-1]["pos"] = list(range(kv_len, kv_len + n))
        packed += n
    assert prefix_gather_mode(packed + pad, 2, hkv, hq // hkv, d) == "per_sequence"
    kw = dict(scale=0.2, window=0, softcap=None, tree=False, block=DEFAULT_BLOCK, key_block=4)
    with mock.patch.object(prefix_segments, "ROW_WINDOW", 8):
        assert_blocked_equal(rng, k_pool, v_pool, seqs, packed, pad, hq, hkv, d, **kw)


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("block,key_block", [(16, 4), (7, 3), (64, 8)])
def test_branches_off_a_question_match_the_reference(block, key_block, window):
    """Documents as branches off a question (clustering's step) and drafts with their passages (evidence
    verification), where most of a query block's earlier keys are other branches': equal to the reference and
    brute force, including branches that start and end inside a key block."""
    rng = np.random.default_rng(block * 100 + key_block + window)
    ps, hq, hkv, d = 4, 4, 2, 8
    kv_len, question, branches = 6, 3, [7, 9, 4, 12, 5, 8]
    parents, pos = list(range(-1, question - 1)), list(range(kv_len, kv_len + question))
    for n in branches:
        start = len(parents)
        parents += [question - 1] + list(range(start, start + n - 1))
        pos += list(range(kv_len + question, kv_len + question + n))
    total = len(parents)
    n_pages = 2 + -(-(kv_len + total) // ps)
    k_pool = rng.normal(size=(n_pages, ps, hkv, d)).astype(np.float32)
    v_pool = rng.normal(size=(n_pages, ps, hkv, d)).astype(np.float32)
    pages = [int(x) for x in rng.permutation(np.arange(1, n_pages))[: -(-(kv_len + total) // ps)]]
    seqs = [dict(kv_len=kv_len, pages=pages, parents=parents, tokens=list(range(total)), pos=pos)]
    kw = dict(scale=0.4, window=window, softcap=None, tree=True, block=block, key_block=key_block)
    assert_blocked_equal(rng, k_pool, v_pool, seqs, total, 3, hq, hkv, d, **kw)


def test_pack_refuses_a_parent_after_its_child():
    with pytest.raises(SpecRagError, match="parent must be packed before it"):
        pack_chunks([Chunk([1], 0, [5, 6, 7], parents=[-1, 2, 0], write=False)], page_size=4, num_slots=64)


@pytest.mark.parametrize("n", [*range(1, 300), 511, 512, 513, 1317, 2049, 3924, 8191])
def test_token_buckets_waste_under_a_ninth_above_256(n):
    b = token_count_bucket(n)
    assert b >= n
    if n > 256:
        assert (b - n) / b < 1 / 9
        assert b % 32 == 0
    else:
        assert b & (b - 1) == 0  # powers of two below: few small programs


def test_token_bucket_enumeration_covers_every_padded_count():
    ladder = token_count_buckets(16, 2048)
    assert {token_count_bucket(n, 16) for n in range(1, 2049)} == set(ladder)
    assert ladder == sorted(ladder) and ladder[0] == 16 and ladder[-1] == 2048
