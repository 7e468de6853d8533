"""The key-blocked decode attention (the CPU decode path) against the reference, on random and edge shapes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.extend.core import jaxprs_in_params

from specrag_jax.kernels import AttentionMetadata, decode_blocked, paged_attention, paged_tree_attention_reference
from specrag_jax.kernels.decode_blocked import paged_decode_attention_blocked, use_stacked

HEADS = [(4, 1, 32), (9, 3, 16), (4, 4, 8), (8, 2, 16)]  # (q heads, kv heads, head_dim)
T = 8  # tokens per step (fixed: the jitted functions are reused across examples)


def decode_step(rng, heads, ps, lens, p_max, *, order=None, dtype=jnp.float32):
    """Token i continues sequence order[i] (position kv_len); tokens past len(lens) are padding."""
    hq, hkv, d = heads
    n_pages = 1 + sum(-(-(n + 1) // ps) for n in lens)
    k_pool, v_pool = (jnp.asarray(rng.normal(size=(n_pages, ps, hkv, d)), dtype) for _ in range(2))
    q = jnp.asarray(rng.normal(size=(T, hq, d)), dtype)
    k_new, v_new = (jnp.asarray(rng.normal(size=(T, hkv, d)), dtype) for _ in range(2))
    s = len(lens)
    order = np.arange(s) if order is None else np.asarray(order)
    free = list(rng.permutation(np.arange(1, n_pages)))
    tables = np.zeros((max(s, 1), p_max), np.int32)  # unused entries: the null page 0
    for i, n in enumerate(lens):
        tables[i, : -(-(n + 1) // ps)] = [free.pop() for _ in range(-(-(n + 1) // ps))]
    kv_lens = np.zeros(max(s, 1), np.int32)
    kv_lens[:s] = lens
    token_seq = np.zeros(T, np.int32)
    token_seq[:s] = order
    valid = np.arange(T) < s
    meta = AttentionMetadata(
        token_seq,
        np.where(valid, kv_lens[token_seq], 0).astype(np.int32),
        np.full(T, -1, np.int32),
        valid,
        np.full(T, n_pages * ps, np.int32),
        tables,
        kv_lens,
    )
    return q, k_new, v_new, k_pool, v_pool, meta


@functools.cache
def _blocked(softcap, block_tokens, packed=None, stacked=None):
    fn = functools.partial(
        paged_decode_attention_blocked,
        scale=0.3,
        softcap=softcap,
        block_tokens=block_tokens,
        packed=packed,
        stacked=stacked,
    )
    return jax.jit(fn)


@functools.cache
def _reference(softcap):
    return jax.jit(functools.partial(paged_tree_attention_reference, scale=0.3, softcap=softcap, tree=False))


def check(case, window, softcap, block_tokens, tol=2e-5, packed=None, stacked=None):
    got = np.asarray(_blocked(softcap, block_tokens, packed, stacked)(*case, window=window), np.float32)
    want = np.asarray(_reference(softcap)(*case, window=window), np.float32)
    assert np.abs(got - want).max() <= tol, np.abs(got - want).max()
    assert np.all(got[~np.asarray(case[-1].token_valid)] == 0)


@settings(max_examples=25, deadline=None)
@given(
    heads=st.sampled_from(HEADS),
    ps=st.sampled_from([1, 4, 16]),
    lens=st.lists(st.integers(0, 70), min_size=1, max_size=T),
    window=st.sampled_from([0, 1, 5, 33]),
    softcap=st.sampled_from([None, 20.0]),
    block_tokens=st.sampled_from([1, 16, 48, 128]),
    packed=st.sampled_from([None, False, True]),
    stacked=st.sampled_from([None, False, True]),
    seed=st.integers(0, 2**16),
)
def test_matches_reference_on_random_steps(heads, ps, lens, window, softcap, block_tokens, packed, stacked, seed):
    """Both loop schedules (lockstep over blocks, packed (row, block) pairs; None: the default for T rows) in
    both head forms (grouped, stacked; None: the default for the KV heads)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lens))  # tokens need not follow sequence order
    p_max = -(-(max(lens) + 1) // ps) + int(rng.integers(0, 3))  # a bucket wider than the longest sequence
    case = decode_step(rng, heads, ps, lens, p_max, order=order)
    check(case, window, softcap, block_tokens, packed=packed, stacked=stacked)


def test_edge_steps():
    rng = np.random.default_rng(0)
    # every sequence empty; exactly full pages; one long sequence among empty ones; a traced window
    for lens in ([0, 0, 0], [16, 32, 48], [0, 200, 0, 1]):
        case = decode_step(rng, HEADS[1], 16, lens, -(-(max(lens) + 1) // 16) + 1)
        check(case, 0, None, 32)
        check(case, jnp.int32(17), None, 32)
    # packed pairs: one long row among short ones and padding, so slots of one iteration hit the same row, and
    # an iteration's last slots lie past the step's last pair
    for lens in ([3, 200, 1, 0, 40], [100, 100, 100, 100, 100, 100, 100, 7]):
        case = decode_step(rng, HEADS[3], 4, lens, -(-(max(lens) + 1) // 4) + 2)
        for packed in (False, True):
            for stacked in (False, True):
                check(case, 0, None, 16, packed=packed, stacked=stacked)
                check(case, 9, 20.0, 16, packed=packed, stacked=stacked)
    # bfloat16 pools and queries (3 KV heads: the stacked form's block-diagonal query is not the identity)
    case = decode_step(rng, HEADS[1], 4, [9, 50, 3], 16, dtype=jnp.bfloat16)
    for stacked in (False, True):
        check(case, 0, 30.0, 16, tol=2e-2, stacked=stacked)


def test_every_head_shape_in_both_forms_and_schedules():
    """Each head shape (1-4 KV heads, 1-4 query heads each) in both head forms and both loop schedules, with a
    window and a softcap, on one ragged step with a padding row."""
    rng = np.random.default_rng(5)
    for heads in HEADS:
        case = decode_step(rng, heads, 4, [21, 3, 60, 0, 37], 18)
        for packed in (False, True):
            for stacked in (False, True):
                check(case, 0, None, 16, packed=packed, stacked=stacked)
                check(case, 11, 25.0, 16, packed=packed, stacked=stacked)


def _accumulator_widths(stacked_heads: bool, monkeypatch) -> set[int]:
    """Last-axis widths of the [T, Hq, width] float32 arrays in the traced kernel (9 query and 3 KV heads of 16)."""
    monkeypatch.setattr(decode_blocked, "STACKED_HEADS", stacked_heads)
    case = decode_step(np.random.default_rng(0), HEADS[1], 4, [5, 9], 4)
    jaxpr = jax.make_jaxpr(functools.partial(paged_decode_attention_blocked, scale=0.3))(*case)
    shapes = {v.aval.shape for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars if hasattr(v.aval, "shape")}
    for eqn in jaxpr.jaxpr.eqns:  # the loops' bodies
        for sub in jaxprs_in_params(eqn.params):
            shapes |= {v.aval.shape for e in sub.eqns for v in e.outvars if hasattr(v.aval, "shape")}
    return {shape[2] for shape in shapes if len(shape) == 3 and shape[:2] == (T, 9)}


def test_head_form_rule(monkeypatch):
    """The stacked form up to ``STACKED_MAX_KV_HEADS`` KV heads on one device unless switched off; forcing wins; and
    the kernel follows the rule: its accumulator is [T, Hq, Hkv * D] stacked, [T, Hq, D] grouped."""
    assert use_stacked(1) and use_stacked(decode_blocked.STACKED_MAX_KV_HEADS)
    assert not use_stacked(decode_blocked.STACKED_MAX_KV_HEADS + 1)
    assert use_stacked(8, True) and not use_stacked(1, False)
    assert 48 in _accumulator_widths(True, monkeypatch)
    assert 48 not in _accumulator_widths(False, monkeypatch)
    assert not use_stacked(1)  # STACKED_HEADS is off here
    monkeypatch.setattr(decode_blocked, "STACKED_HEADS", True)
    monkeypatch.setattr(jax, "device_count", lambda: 8)  # a mesh may shard the heads: grouped, unless forced
    assert not use_stacked(1) and use_stacked(1, True)


def test_dispatch_uses_it_for_decode_steps():
    """``paged_attention`` (impl "reference", decode=True) returns the blocked result exactly."""
    case = decode_step(np.random.default_rng(3), HEADS[1], 4, [5, 17, 0, 40], 12)
    got = paged_attention(*case, scale=0.3, decode=True, tree=False)
    want = paged_decode_attention_blocked(*case, scale=0.3)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
