"""kv_transfer: paged K/V reads and writes against numpy, and stored prefixes reproduce a fresh prefill."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import KVPool
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.kv_transfer import (
    host_to_pool,
    host_to_pool_many,
    pool_to_host,
    runner_read_kv,
    runner_write_kv,
)
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.executor.runner import ModelRunner

L, P, PS, H, D = 2, 12, 4, 2, 3


def _pool(rng: np.random.Generator) -> tuple[KVPool, np.ndarray, np.ndarray]:
    k = rng.standard_normal((L, P, PS, H, D)).astype(np.float32)
    v = rng.standard_normal((L, P, PS, H, D)).astype(np.float32)
    return KVPool(tuple(jnp.asarray(x) for x in k), tuple(jnp.asarray(x) for x in v)), k, v


@st.composite
def _sequence(draw):
    n_pages = draw(st.integers(1, P - 1))
    pages = draw(st.permutations(list(range(1, P))))[:n_pages]
    n = draw(st.integers(0, n_pages * PS))  # often not a multiple of the page size
    return pages, n, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=40, deadline=None)
@given(_sequence())
def test_read_and_write_match_numpy(seq):
    pages, n, seed = seq
    rng = np.random.default_rng(seed)
    pool, k_ref, v_ref = _pool(rng)
    logical = np.arange(n)
    page_of, off = np.asarray(pages)[logical // PS], logical % PS
    k, v = pool_to_host(pool, pages, n)
    assert k.shape == (L, n, H, D)
    np.testing.assert_array_equal(k, k_ref[:, page_of, off])
    np.testing.assert_array_equal(v, v_ref[:, page_of, off])
    new_k = rng.standard_normal((L, n, H, D)).astype(np.float32)
    new_v = rng.standard_normal((L, n, H, D)).astype(np.float32)
    pool = host_to_pool(pool, pages, new_k, new_v)
    k_ref[:, page_of, off], v_ref[:, page_of, off] = new_k, new_v
    np.testing.assert_array_equal(np.stack([np.asarray(x) for x in pool.k]), k_ref)  # nothing else touched
    np.testing.assert_array_equal(np.stack([np.asarray(x) for x in pool.v]), v_ref)


def test_write_many_in_one_call():
    rng = np.random.default_rng(0)
    pool, k_ref, _ = _pool(rng)
    items = [([3, 7], rng.standard_normal((L, 5, H, D)).astype(np.float32)), ([1], np.ones((L, 4, H, D), np.float32))]
    pool = host_to_pool_many(pool, [(p, k, k * 2) for p, k in items])
    for pages, k in items:
        got_k, got_v = pool_to_host(pool, pages, k.shape[1])
        np.testing.assert_array_equal(got_k, k)
        np.testing.assert_array_equal(got_v, k * 2)
    np.testing.assert_array_equal(np.asarray(pool.k[0])[5], k_ref[0, 5])


def test_bad_input_is_one_line_error():
    pool, _, _ = _pool(np.random.default_rng(0))
    with pytest.raises(SpecRagError, match="do not fit"):
        pool_to_host(pool, [1], PS + 1)
    with pytest.raises(SpecRagError, match="page ids"):
        pool_to_host(pool, [0], 1)
    with pytest.raises(SpecRagError, match="do not match"):
        host_to_pool(pool, [1], np.zeros((L, 2, H, D + 1), np.float32), np.zeros((L, 2, H, D + 1), np.float32))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_restored_prefix_gives_fresh_prefill_logits(arch):
    """Prefill a prefix, read its K/V, write it into other pages: a suffix after them matches a fresh prefill."""
    cfg = tiny_config(arch, tie_embeddings=arch == "gemma3")
    runner = ModelRunner(cfg, init_params(cfg, seed=1), num_pages=32, page_size=4, max_seq_len=128)
    rng = np.random.default_rng(2)
    prefix, suffix = rng.integers(3, 90, 23).tolist(), rng.integers(3, 90, 6).tolist()  # 23: not a page multiple
    first = runner.allocator.allocate(6)
    runner.score(runner.pack([Chunk(first, 0, prefix)]), [])
    k, v = runner_read_kv(runner, first, len(prefix))
    runner.allocator.release(first)
    zeros = lambda xs: tuple(jnp.zeros_like(x) for x in xs)  # noqa: E731
    runner.pool = KVPool(zeros(runner.pool.k), zeros(runner.pool.v))
    other = runner.allocator.allocate(6)[::-1]  # other pages, in another order
    runner_write_kv(runner, [(other, k, v)])
    k2, v2 = runner_read_kv(runner, other, len(prefix))
    np.testing.assert_array_equal(k2, k)
    np.testing.assert_array_equal(v2, v)
    rows = list(range(len(suffix)))
    cached = runner.logits(runner.pack([Chunk(other, len(prefix), suffix, write=False, rows=rows)]))
    fresh = runner.logits(
        runner.pack([Chunk([], 0, prefix + suffix, write=False, rows=[len(prefix) + r for r in rows])])
    )
    np.testing.assert_allclose(cached, fresh, atol=1e-4, rtol=1e-4)
    runner.allocator.release(other)
    assert runner.allocator.num_free == runner.allocator.num_usable


def test_scatter_updates_the_pool_in_place():
    """The donated pool is aliased to the output and no pool-sized temporary exists (no whole-pool copy)."""
    from specrag_jax.kernels import make_pool
    from specrag_jax.models.executor import kv_transfer

    pool = make_pool(2, 500, 16, 2, 32)
    pool_bytes = 2 * 2 * 500 * 16 * 2 * 32 * 4
    pid, off = np.full(64, 5, np.int32), np.arange(64, dtype=np.int32) % 16
    k = np.zeros((2, 64, 2, 32), np.float32)
    mem = kv_transfer._scatter.lower(pool, pid, off, k, k).compile().memory_analysis()
    assert mem.alias_size_in_bytes == pool_bytes
    assert mem.temp_size_in_bytes < pool_bytes // 20
