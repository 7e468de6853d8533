"""The Pallas paged decode kernel (both variants, CPU interpret mode) against the reference; lowering checks."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import AttentionMetadata, paged_tree_attention_reference, write_kv
from specrag_jax.kernels.pallas_decode import (
    GPU_EXPORT_DISABLED_CHECKS,
    is_decode_step,
    paged_decode_attention_pallas,
)
from specrag_jax.kernels.pallas_decode_blocks import DecodeBlockSizes

GEMMA, SMOL = (4, 1, 256), (9, 3, 64)  # (q heads, kv heads, head_dim)
T, N_PAGES = 8, 48  # fixed shapes, so the jitted kernels are reused across cases
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}


def decode_case(rng, heads, ps, lens, p_max, *, dtype=jnp.float32, tables=None, n_pages=N_PAGES):
    """One decode step: token i is sequence i's next token (position kv_len); tokens past len(lens) pad."""
    hq, hkv, d = heads
    if tables is None:
        n_pages = max(n_pages, 1 + sum(-(-(n + 1) // ps) for n in lens))
    k_pool, v_pool = (jnp.asarray(rng.normal(size=(n_pages, ps, hkv, d)), dtype) for _ in range(2))
    q = jnp.asarray(rng.normal(size=(T, hq, d)), dtype)
    k_new, v_new = (jnp.asarray(rng.normal(size=(T, hkv, d)), dtype) for _ in range(2))
    kv_lens = np.zeros(T, np.int32)
    kv_lens[: len(lens)] = lens
    if tables is None:  # distinct random pages per sequence; unused entries point at the null page 0
        free = list(rng.permutation(np.arange(1, n_pages)))
        tables = np.zeros((T, p_max), np.int32)
        for s, n in enumerate(lens):
            tables[s, : -(-(n + 1) // ps)] = [free.pop() for _ in range(-(-(n + 1) // ps))]
    idx = np.arange(T, dtype=np.int32)
    meta = AttentionMetadata(
        idx,
        kv_lens.copy(),
        np.full(T, -1, np.int32),
        idx < len(lens),
        np.full(T, n_pages * ps, np.int32),
        np.asarray(tables, np.int32),
        kv_lens,
    )
    return q, k_new, v_new, k_pool, v_pool, meta


@functools.cache
def kernel(backend, softcap, sizes):
    return jax.jit(
        functools.partial(
            paged_decode_attention_pallas, scale=0.125, softcap=softcap, backend=backend, block_sizes=sizes
        )
    )


_reference = jax.jit(paged_tree_attention_reference, static_argnames=("scale", "softcap", "tree"))


def check(backend, case, window, softcap, sizes, dtype=jnp.float32, pools=None):
    q, k_new, v_new, k_pool, v_pool, meta = case
    got = kernel(backend, softcap, sizes)(q, k_new, v_new, *(pools or (k_pool, v_pool)), meta, window=window)
    want = _reference(q, k_new, v_new, k_pool, v_pool, meta, scale=0.125, window=window, softcap=softcap)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.abs(got - want).max() <= TOL[dtype], (window, np.abs(got - want).max())
    assert np.all(got[~np.asarray(meta.token_valid)] == 0)


SWEEP = [  # (heads, page size, softcap, dtype, kv lens: incl. 0, exactly full pages, ragged)
    (GEMMA, 16, None, jnp.float32, [0, 16, 33, 64, 5, 1, 48, 95]),
    (GEMMA, 64, 50.0, jnp.bfloat16, [128, 0, 191]),
    (SMOL, 4, 30.0, jnp.float32, [7, 0, 8, 40, 3, 12]),
    (SMOL, 1, None, jnp.float32, [0, 1, 9, 17]),
    (SMOL, 32, None, jnp.bfloat16, [100]),
]


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("heads,ps,softcap,dtype,lens", SWEEP)
def test_matches_reference(backend, heads, ps, softcap, dtype, lens):
    rng = np.random.default_rng(ps)
    p_max = -(-(max(lens) + 1) // ps) + 1
    case = decode_case(rng, heads, ps, lens, p_max, dtype=dtype)
    sizes = DecodeBlockSizes(kv_tokens_per_block=2 * ps, max_splits=3)  # several splits and blocks per split
    for window in (0, 1, 7, 40):
        check(backend, case, window, softcap, sizes, dtype)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_default_block_table_and_skipped_pages_are_never_read(backend):
    """Pages past kv_len, wholly before the window, or unused (null page) hold NaN: any read would show."""
    rng = np.random.default_rng(1)
    ps, lens, window = 16, [0, 40, 80, 16, 130], 30
    case = decode_case(rng, GEMMA, ps, lens, 10)
    meta = case[-1]
    active = set()
    for s, n in enumerate(lens):
        lo = max(0, n - window + 1)
        active |= {int(meta.page_table[s, p]) for p in range(lo // ps, -(-n // ps))}
    dead = np.array([p not in active for p in range(N_PAGES)])

    def poison(pool):
        return jnp.where(dead[:, None, None, None], jnp.nan, pool)

    check(backend, case, window, None, None, pools=(poison(case[3]), poison(case[4])))


@settings(max_examples=20, deadline=None)
@given(
    data=st.data(),
    backend=st.sampled_from(["tpu", "gpu"]),
    heads=st.sampled_from([GEMMA, SMOL]),
    ps=st.sampled_from([4, 16]),
    window=st.sampled_from([0, 1, 5, 17]),
)
def test_hypothesis_page_tables(data, backend, heads, ps, window):
    """Arbitrary page tables (shared and repeated pages allowed: decode only reads) and ragged lengths."""
    p_max, n_pages = 6, 16
    batch = data.draw(st.integers(1, T))
    lens = data.draw(st.lists(st.integers(0, p_max * ps - 1), min_size=batch, max_size=batch))
    tables = data.draw(
        st.lists(st.lists(st.integers(0, n_pages - 1), min_size=p_max, max_size=p_max), min_size=T, max_size=T)
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    case = decode_case(rng, heads, ps, lens, p_max, tables=tables, n_pages=n_pages)
    check(backend, case, window, None, DecodeBlockSizes(kv_tokens_per_block=2 * ps, max_splits=2))


def test_precondition_is_checked():
    case = decode_case(np.random.default_rng(0), SMOL, 4, [3, 5], 3)
    meta = case[-1]
    assert is_decode_step(meta)
    got = jax.jit(functools.partial(paged_decode_attention_pallas, scale=1.0))(*case)  # "gpu", interpreted
    want = _reference(*case, scale=1.0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
    two_tokens = AttentionMetadata(
        np.zeros(T, np.int32),
        meta.positions,
        meta.parents,
        meta.token_valid,
        meta.write_slots,
        meta.page_table,
        meta.kv_lens,
    )
    assert not is_decode_step(two_tokens)
    with pytest.raises(SpecRagError, match="decode step"):
        paged_decode_attention_pallas(*case[:-1], two_tokens, scale=1.0)


def test_write_kv_updates_the_donated_pool_in_place():
    """Why no fused Pallas write: the jnp scatter already reuses the donated pool buffer."""
    pool = jnp.zeros((4, 16, 1, 256), jnp.float32)
    ptr = pool.unsafe_buffer_pointer()
    out = jax.jit(write_kv, donate_argnums=0)(pool, jnp.ones((2, 1, 256)), jnp.array([17, 99], jnp.int32))
    assert out.unsafe_buffer_pointer() == ptr and float(out[1, 1].sum()) == 256


def _export(backend, platform, heads=GEMMA, **kwargs):
    hq, hkv, d = heads

    def i32(*s):
        return jax.ShapeDtypeStruct(s, jnp.int32)

    def arr(*s):
        return jax.ShapeDtypeStruct(s, jnp.bfloat16)

    bool_t = jax.ShapeDtypeStruct((T,), jnp.bool_)
    meta = AttentionMetadata(i32(T), i32(T), i32(T), bool_t, i32(T), i32(T, 8), i32(T))
    f = functools.partial(paged_decode_attention_pallas, scale=0.1, softcap=30.0, backend=backend, interpret=False)
    return jax.export.export(jax.jit(f), platforms=[platform], **kwargs)(
        arr(T, hq, d), arr(T, hkv, d), arr(T, hkv, d), arr(64, 16, hkv, d), arr(64, 16, hkv, d), meta, window=7
    )


@pytest.mark.parametrize("heads", [GEMMA, SMOL])
def test_tpu_variant_lowers_for_tpu(heads):
    assert "tpu_custom_call" in _export("tpu", "tpu", heads).mlir_module()


@pytest.mark.parametrize("heads", [GEMMA, SMOL])
def test_gpu_variant_lowers_for_cuda(heads):
    text = _export("gpu", "cuda", heads, disabled_checks=GPU_EXPORT_DISABLED_CHECKS).mlir_module()
    assert "__gpu$xla.gpu.triton" in text


@pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason=(
        "'Cannot serialize code with custom calls whose targets have no compatibility guarantees' "
        "(__gpu$xla.gpu.triton): Triton kernels export only with GPU_EXPORT_DISABLED_CHECKS"
    ),
)
def test_gpu_variant_export_needs_disabled_checks():
    _export("gpu", "cuda")


@pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason=(
        "'Compiler params for platform tpu cannot be used for gpu lowering.' (or, before Mosaic TPU's lowering "
        "is registered, 'Cannot lower pallas_call on platform: gpu...'): the TPU variant carries "
        "pltpu.CompilerParams and DMA/semaphore ops; by design it is TPU-only"
    ),
)
def test_tpu_variant_does_not_lower_for_cuda():
    _export("tpu", "cuda")


@pytest.mark.xfail(
    strict=True,
    raises=(ValueError, AssertionError),
    reason=(
        "'Compiler params for platform gpu cannot be used for tpu lowering.' (or, before the Triton lowering is "
        "registered, a bare 'assert isinstance(compiler_params, tpu_core.CompilerParams)' in Mosaic TPU's "
        "pallas_call_tpu_lowering_rule): the GPU variant carries Triton CompilerParams; by design GPU-only"
    ),
)
def test_gpu_variant_does_not_lower_for_tpu():
    _export("gpu", "tpu")
