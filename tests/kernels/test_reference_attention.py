"""The reference paged tree attention against an independent brute-force NumPy attention."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.kernels import AttentionMetadata, ancestor_mask, paged_tree_attention_reference, write_kv
from specrag_jax.kernels.reference import prefix_gather_mode


def brute_force(q, k_new, v_new, k_pool, v_pool, seqs, scale, window, softcap):
    """Per query token: collect visible keys explicitly (prefix pages + ancestors), softmax in float64."""
    out = np.zeros(q.shape, np.float64)
    hq, hkv = q.shape[1], k_new.shape[1]
    ps = k_pool.shape[1]
    for s in seqs:
        for i, t in enumerate(s["tokens"]):
            keys, vals, kpos = [], [], []
            for j in range(s["kv_len"]):
                page = s["pages"][j // ps]
                keys.append(k_pool[page, j % ps])
                vals.append(v_pool[page, j % ps])
                kpos.append(j)
            a = i
            chain = []
            while a >= 0:
                chain.append(a)
                a = s["parents"][a]
            for a in sorted(chain):
                keys.append(k_new[s["tokens"][a]])
                vals.append(v_new[s["tokens"][a]])
                kpos.append(s["pos"][a])
            keys, vals, kpos = np.array(keys, np.float64), np.array(vals, np.float64), np.array(kpos)
            visible = (window <= 0) | (s["pos"][i] - kpos < window)
            for h in range(hq):
                kh = h // (hq // hkv)
                sc = keys[:, kh] @ q[t, h].astype(np.float64) * scale
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                sc = np.where(visible, sc, -np.inf)
                p = np.exp(sc - sc.max())
                out[t, h] = (p / p.sum()) @ vals[:, kh]
    return out


def random_case(rng, n_seqs, max_prefix, max_chunk, ps, hq, hkv, d, tree):
    n_pages = 1 + sum(-(-(max_prefix + max_chunk) // ps) for _ in range(n_seqs)) + 2
    k_pool = rng.normal(size=(n_pages, ps, hkv, d)).astype(np.float32)
    v_pool = rng.normal(size=(n_pages, ps, hkv, d)).astype(np.float32)
    free = list(rng.permutation(np.arange(1, n_pages)))
    seqs, packed = [], 0
    for _ in range(n_seqs):
        kv_len = int(rng.integers(0, max_prefix + 1))
        n = int(rng.integers(1, max_chunk + 1))
        pages = [int(free.pop()) for _ in range(-(-(kv_len + n) // ps))]
        if tree:
            parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        else:
            parents = list(range(-1, n - 1))
        depth = []
        for i in range(n):
            depth.append(0 if parents[i] < 0 else depth[parents[i]] + 1)
        seqs.append(
            dict(
                kv_len=kv_len,
                pages=pages,
                parents=parents,
                tokens=list(range(packed, packed + n)),
                pos=[kv_len + dd for dd in depth],
            )
        )
        packed += n
    return k_pool, v_pool, seqs, packed


def to_meta(seqs, t_pad, ps, n_pages):
    p_max = max(len(s["pages"]) for s in seqs)
    token_seq = np.zeros(t_pad, np.int32)
    positions = np.zeros(t_pad, np.int32)
    parents = np.full(t_pad, -1, np.int32)
    valid = np.zeros(t_pad, bool)
    page_table = np.zeros((len(seqs), p_max), np.int32)
    kv_lens = np.zeros(len(seqs), np.int32)
    for si, s in enumerate(seqs):
        page_table[si, : len(s["pages"])] = s["pages"]
        kv_lens[si] = s["kv_len"]
        for i, t in enumerate(s["tokens"]):
            token_seq[t] = si
            positions[t] = s["pos"][i]
            valid[t] = True
            parents[t] = -1 if s["parents"][i] < 0 else s["tokens"][s["parents"][i]]
    return AttentionMetadata(
        token_seq, positions, parents, valid, np.full(t_pad, n_pages * ps, np.int32), page_table, kv_lens
    )


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_seqs=st.integers(1, 3),
    ps=st.sampled_from([1, 2, 4, 16]),
    tree=st.booleans(),
    window=st.sampled_from([0, 1, 3, 8]),
    softcap=st.sampled_from([None, 5.0]),
    heads=st.sampled_from([(4, 1), (4, 2), (3, 3)]),
    prefix_gather=st.sampled_from(["auto", "per_sequence", "per_token"]),
)
def test_reference_matches_brute_force(seed, n_seqs, ps, tree, window, softcap, heads, prefix_gather):
    rng = np.random.default_rng(seed)
    hq, hkv = heads
    d = 8
    k_pool, v_pool, seqs, total = random_case(rng, n_seqs, 12, 6, ps, hq, hkv, d, tree)
    t_pad = total + int(rng.integers(0, 3))
    q = rng.normal(size=(t_pad, hq, d)).astype(np.float32)
    k_new = rng.normal(size=(t_pad, hkv, d)).astype(np.float32)
    v_new = rng.normal(size=(t_pad, hkv, d)).astype(np.float32)
    meta = to_meta(seqs, t_pad, ps, k_pool.shape[0])
    got = np.asarray(
        paged_tree_attention_reference(
            q,
            k_new,
            v_new,
            k_pool,
            v_pool,
            meta,
            scale=0.3,
            window=window,
            softcap=softcap,
            tree=tree,
            prefix_gather=prefix_gather,
        )
    )
    want = brute_force(q, k_new, v_new, k_pool, v_pool, seqs, 0.3, window, softcap)
    np.testing.assert_allclose(got[:total], want[:total], atol=2e-5, rtol=1e-5)
    assert np.all(got[total:] == 0)


def test_ancestor_mask_deep_chain_and_forest():
    parents = np.array([-1, 0, 1, 2, 3, 4, 5, 6, 7, -1, 9, 9, 11], np.int32)
    m = np.asarray(ancestor_mask(parents))
    assert m[8].tolist() == [True] * 9 + [False] * 4
    assert m[12].tolist() == [False] * 9 + [True, False, True, True]
    assert m[10].tolist() == [False] * 9 + [True, True, False, False]


def test_write_kv_drops_out_of_range_slots():
    pool = jnp.zeros((3, 4, 1, 2), jnp.float32)
    out = np.asarray(write_kv(pool, np.ones((3, 1, 2), np.float32), np.array([5, 12, 99], np.int32)))
    assert out[1, 1].sum() == 2  # slot 5 = page 1, offset 1
    assert out.sum() == 2  # 12 and 99 are outside a 3x4 pool


@pytest.mark.parametrize("kv_len", [0, 5])
def test_all_roots_tree_sees_only_prefix_and_self(kv_len):
    rng = np.random.default_rng(0)
    k_pool, v_pool = rng.normal(size=(2, 2, 8, 1, 4)).astype(np.float32)
    seqs = [dict(kv_len=kv_len, pages=[1], parents=[-1, -1, -1], tokens=[0, 1, 2], pos=[kv_len] * 3)]
    q, k_new, v_new = (rng.normal(size=(3, h, 4)).astype(np.float32) for h in (2, 1, 1))
    meta = to_meta(seqs, 3, 8, 2)
    got = np.asarray(paged_tree_attention_reference(q, k_new, v_new, k_pool, v_pool, meta, scale=1.0))
    np.testing.assert_allclose(got, brute_force(q, k_new, v_new, k_pool, v_pool, seqs, 1.0, 0, None), atol=2e-5)


def test_prefix_gather_mode_follows_the_step_shape():
    smol = dict(kv_heads=3, group=3, head_dim=64)
    assert prefix_gather_mode(32, 32, **smol) == "per_token"  # many decoding sequences
    assert prefix_gather_mode(256, 32, **smol) == "per_token"  # mixed decode + prefill step
    assert prefix_gather_mode(256, 8, **smol) == "per_sequence"  # a long prefill of few sequences
    assert prefix_gather_mode(64, 1, **smol) == "per_sequence"
    with pytest.raises(ValueError, match="prefix_gather"):
        rng = np.random.default_rng(0)
        k_pool, v_pool, seqs, total = random_case(rng, 2, 4, 2, 4, 2, 1, 8, False)
        q = rng.normal(size=(total, 2, 8)).astype(np.float32)
        kv = rng.normal(size=(total, 1, 8)).astype(np.float32)
        paged_tree_attention_reference(
            q, kv, kv, k_pool, v_pool, to_meta(seqs, total, 4, k_pool.shape[0]), scale=1.0, prefix_gather="bogus"
        )
