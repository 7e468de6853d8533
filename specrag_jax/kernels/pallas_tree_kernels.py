"""Kernel bodies of the Pallas tree attention (TPU: scalar prefetch + DMA; GPU: in-kernel gather, Triton).

See ``pallas_tree`` for the design; ``tree_plan`` builds the work lists and compact mask they read.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from specrag_jax.kernels.tree_block_sizes import TreeBlocks
from specrag_jax.kernels.tree_plan import TreePlan

_NEG = -1e30
F32 = jnp.float32


def _scores(q, k, scale: float, softcap: float | None, prec):
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=F32, precision=prec) * scale
    return s if softcap is None else softcap * jnp.tanh(s / softcap)


def _update(carry, s, mask, v, prec):
    """One online-softmax step over a [rows, keys] score tile."""
    m, denom, acc = carry
    s = jnp.where(mask, s, _NEG)
    m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    alpha = jnp.exp(m - m_new)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=F32, precision=prec)
    return m_new, alpha * denom + p.sum(axis=1, keepdims=True), alpha * acc + pv


def _prefix_mask(seq_q, pos_q, s, kv_len, first_key, n_keys: int, window):
    kk = first_key + lax.broadcasted_iota(jnp.int32, (1, n_keys), 1)
    return (seq_q == s) & (kk < kv_len) & ((window <= 0) | (pos_q - kk < window))


def _chunk_mask(seq_q, pos_q, tin_q, seq_k, pos_k, tin_k, tend_k, window):
    return (seq_q == seq_k) & (tin_k <= tin_q) & (tin_q < tend_k) & ((window <= 0) | (pos_q - pos_k < window))


def _finish(carry):
    _, denom, acc = carry
    return acc / jnp.where(denom == 0.0, 1.0, denom)


def _tpu_kernel(
    pair_start,
    pair_seq,
    pair_lo,
    pair_hi,
    chunk_start,
    chunk_blk,
    table,
    kv_lens,
    win,
    q_ref,
    qinfo_ref,
    kinfo_ref,
    k_pool,
    v_pool,
    k_new,
    v_new,
    o_ref,
    kbuf,
    vbuf,
    kcbuf,
    vcbuf,
    sems,
    *,
    blocks: TreeBlocks,
    g: int,
    scale,
    softcap,
    prec,
):
    """Grid (kv_head h, query block b). Rows are head-major: row r = head (r // bq) of token (r % bq)."""
    h, b = pl.program_id(0), pl.program_id(1)
    bq, bc, ppb, ps = blocks.q, blocks.chunk, blocks.pages_per_block, blocks.page_size
    d = q_ref.shape[-1]
    width = table.shape[0] // kv_lens.shape[0]
    q = q_ref[...].reshape(g * bq, d)
    qi = jnp.broadcast_to(qinfo_ref[...][None], (g, bq, 4)).reshape(g * bq, 4)
    seq_q, pos_q, tin_q = qi[:, 0:1], qi[:, 1:2], qi[:, 2:3]
    window = win[0]
    carry = (jnp.full((g * bq, 1), _NEG, F32), jnp.zeros((g * bq, 1), F32), jnp.zeros((g * bq, d), F32))

    def page_copies(s, j, slot):  # one DMA per page (and per K/V), all on the slot's semaphore
        row = s * width + j * ppb
        return [
            pltpu.make_async_copy(pool.at[table[row + p], :, h, :], buf.at[slot, p], sems.at[i, slot])
            for i, (pool, buf) in enumerate(((k_pool, kbuf), (v_pool, vbuf)))
            for p in range(ppb)
        ]

    def chunk_copies(c, slot):
        return [
            pltpu.make_async_copy(src.at[pl.ds(c * bc, bc), h, :], buf.at[slot], sems.at[2 + i, slot])
            for i, (src, buf) in enumerate(((k_new, kcbuf), (v_new, vcbuf)))
        ]

    def start(copies):
        for cp in copies:
            cp.start()

    c0, c1 = chunk_start[b], chunk_start[b + 1]

    @pl.when(c0 < c1)  # the first chunk tile loads while the prefix is processed
    def _():
        start(chunk_copies(chunk_blk[c0], 0))

    def pair_body(pi, carry):
        s, lo, hi = pair_seq[pi], pair_lo[pi], pair_hi[pi]
        start(page_copies(s, lo, 0))

        def blk_body(j, carry):
            slot = (j - lo) % 2

            @pl.when(j + 1 < hi)
            def _():
                start(page_copies(s, j + 1, 1 - slot))

            for cp in page_copies(s, j, slot):
                cp.wait()
            k = kbuf[slot].reshape(ppb * ps, d)
            v = vbuf[slot].reshape(ppb * ps, d)
            mask = _prefix_mask(seq_q, pos_q, s, kv_lens[s], j * ppb * ps, ppb * ps, window)
            return _update(carry, _scores(q, k, scale, softcap, prec), mask, v, prec)

        return lax.fori_loop(lo, hi, blk_body, carry)

    carry = lax.fori_loop(pair_start[b], pair_start[b + 1], pair_body, carry)

    def chunk_body(ci, carry):
        slot = (ci - c0) % 2

        @pl.when(ci + 1 < c1)
        def _():
            start(chunk_copies(chunk_blk[ci + 1], 1 - slot))

        c = chunk_blk[ci]
        for cp in chunk_copies(c, slot):
            cp.wait()
        mask = _chunk_mask(seq_q, pos_q, tin_q, *(kinfo_ref[c, pl.ds(i, 1), :] for i in range(4)), window)
        return _update(carry, _scores(q, kcbuf[slot], scale, softcap, prec), mask, vcbuf[slot], prec)

    carry = lax.fori_loop(c0, c1, chunk_body, carry)
    o_ref[...] = _finish(carry).reshape(g, bq, d).astype(o_ref.dtype)


def call_tpu(
    qt: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    plan: TreePlan,
    *,
    g: int,
    scale: float,
    softcap: float | None,
    prec,
    interpret,
) -> jax.Array:
    """qt [Hkv, g, T_pad, D] -> same shape; k_new/v_new [T_pad, Hkv, D] and pools stay in HBM."""
    hkv, _, t_pad, d = qt.shape
    blocks = plan.blocks
    bq, nq = blocks.q, plan.t_pad // blocks.q
    kernel = functools.partial(_tpu_kernel, blocks=blocks, g=g, scale=scale, softcap=softcap, prec=prec)
    scalars = (
        plan.pair_start,
        plan.pair_seq,
        plan.pair_lo,
        plan.pair_hi,
        plan.chunk_start,
        plan.chunk_blk,
        plan.page_table.reshape(-1),
        plan.kv_lens,
        plan.window,
    )
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(scalars),
        grid=(hkv, nq),
        in_specs=[
            pl.BlockSpec((None, g, bq, d), lambda h, b, *_: (h, 0, b, 0)),
            pl.BlockSpec((bq, 4), lambda h, b, *_: (b, 0)),
            pl.BlockSpec(plan.k_info.shape, lambda h, b, *_: (0, 0, 0)),
            any_spec,
            any_spec,
            any_spec,
            any_spec,
        ],
        out_specs=pl.BlockSpec((None, g, bq, d), lambda h, b, *_: (h, 0, b, 0)),
        scratch_shapes=[
            pltpu.VMEM((2, blocks.pages_per_block, blocks.page_size, d), k_pool.dtype),
            pltpu.VMEM((2, blocks.pages_per_block, blocks.page_size, d), v_pool.dtype),
            pltpu.VMEM((2, blocks.chunk, d), k_new.dtype),
            pltpu.VMEM((2, blocks.chunk, d), v_new.dtype),
            pltpu.SemaphoreType.DMA((4, 2)),
        ],
    )
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(qt.shape, qt.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=interpret
        if isinstance(interpret, pltpu.InterpretParams)
        else (pltpu.InterpretParams() if interpret else False),
        name="paged_tree_attention_tpu",
    )(*scalars, qt, plan.q_info, plan.k_info, k_pool, v_pool, k_new, v_new)


def _gpu_kernel(
    pair_start,
    pair_seq,
    pair_lo,
    pair_hi,
    chunk_start,
    chunk_blk,
    table,
    kv_lens,
    win,
    q_ref,
    qinfo_ref,
    kinfo_ref,
    k_pool,
    v_pool,
    k_new,
    v_new,
    o_ref,
    *,
    blocks: TreeBlocks,
    g: int,
    scale,
    softcap,
    prec,
):
    """Grid (query head, query block); K/V rows are gathered from the flat [pages * page_size] pool."""
    hq, b = pl.program_id(0), pl.program_id(1)
    hk = hq // g
    bc, ppb, ps = blocks.chunk, blocks.pages_per_block, blocks.page_size
    bkv = ppb * ps
    q = q_ref[...]
    bq, d = q.shape
    seq_q, pos_q, tin_q = qinfo_ref[:, 0][:, None], qinfo_ref[:, 1][:, None], qinfo_ref[:, 2][:, None]
    window = win[0]
    carry = (jnp.full((bq, 1), _NEG, F32), jnp.zeros((bq, 1), F32), jnp.zeros((bq, d), F32))
    local = lax.broadcasted_iota(jnp.int32, (bkv,), 0)

    def pair_body(pi, carry):
        s, lo, hi = pair_seq[pi], pair_lo[pi], pair_hi[pi]

        def blk_body(j, carry):
            pages = table[s, j * ppb + local // ps]  # gather page ids, then K/V rows
            rows = pages * ps + local % ps
            k, v = k_pool[rows, hk, :], v_pool[rows, hk, :]
            mask = _prefix_mask(seq_q, pos_q, s, kv_lens[s], j * bkv, bkv, window)
            return _update(carry, _scores(q, k, scale, softcap, prec), mask, v, prec)

        return lax.fori_loop(lo, hi, blk_body, carry)

    carry = lax.fori_loop(pair_start[b], pair_start[b + 1], pair_body, carry)

    def chunk_body(ci, carry):
        c = chunk_blk[ci]
        k, v = k_new[pl.ds(c * bc, bc), hk, :], v_new[pl.ds(c * bc, bc), hk, :]
        mask = _chunk_mask(seq_q, pos_q, tin_q, *(kinfo_ref[c, i, :][None, :] for i in range(4)), window)
        return _update(carry, _scores(q, k, scale, softcap, prec), mask, v, prec)

    carry = lax.fori_loop(chunk_start[b], chunk_start[b + 1], chunk_body, carry)
    o_ref[...] = _finish(carry).astype(o_ref.dtype)


def call_gpu(
    qt: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    plan: TreePlan,
    *,
    g: int,
    scale: float,
    softcap: float | None,
    prec,
    interpret,
) -> jax.Array:
    """qt [Hq, T_pad, D] -> same shape; pools are viewed as [pages * page_size, Hkv, D] (free reshape)."""
    hq, t_pad, d = qt.shape
    blocks = plan.blocks
    bq, nq = blocks.q, plan.t_pad // blocks.q
    kernel = functools.partial(_gpu_kernel, blocks=blocks, g=g, scale=scale, softcap=softcap, prec=prec)
    n, ps = k_pool.shape[:2]
    args = (
        plan.pair_start,
        plan.pair_seq,
        plan.pair_lo,
        plan.pair_hi,
        plan.chunk_start,
        plan.chunk_blk,
        plan.page_table,
        plan.kv_lens,
        plan.window,
        qt,
        plan.q_info,
        plan.k_info,
        k_pool.reshape(n * ps, *k_pool.shape[2:]),
        v_pool.reshape(n * ps, *v_pool.shape[2:]),
        k_new,
        v_new,
    )
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    in_specs = (
        [any_spec] * 9
        + [
            pl.BlockSpec((None, bq, d), lambda h, b: (h, b, 0)),
            pl.BlockSpec((bq, 4), lambda h, b: (b, 0)),
        ]
        + [any_spec] * 5
    )
    return pl.pallas_call(
        kernel,
        grid=(hq, nq),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, bq, d), lambda h, b: (h, b, 0)),
        out_shape=jax.ShapeDtypeStruct(qt.shape, qt.dtype),
        interpret=bool(interpret),
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
        name="paged_tree_attention_gpu",
    )(*args)
