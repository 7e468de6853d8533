"""Pallas paged decode attention (flash-decoding): one query token per sequence, KV read through page tables.

Precondition (the dispatcher checks it with ``is_decode_step``): every valid token is the only token of its
sequence in this step, attached to the cached prefix (``parents == -1``); it sees the visible prefix keys
``lo <= j < kv_len`` (``lo`` from the sliding window) and its own new K/V. Padding tokens output zeros.

Design. Grid ``(T, num_splits)`` (GPU: ``(T, Hkv, num_splits)``); each cell owns one contiguous, even share
of the token's *active* pages (pages beyond ``kv_len`` or wholly before the window are never loaded or
computed), walks it in blocks of ``pages_per_block`` pages with an online softmax over all q heads of a KV
group at once, and writes an unnormalised partial ``(acc, max, sum)``. A small jnp epilogue merges the
splits with the token's own K/V (the flash-decoding reduce), so the kernel never needs this step's K/V in
the pool.

Backends.
- ``"tpu"``: page table, lengths and window starts are scalar-prefetched into SMEM
  (``pltpu.PrefetchScalarGridSpec``); pages are DMA'd from HBM (``memory_space=pl.ANY``) into double-buffered
  VMEM with ``pltpu.make_async_copy``; one cell serves every KV head of a page. On CPU it runs under the TPU
  interpreter (``interpret=pltpu.InterpretParams()``). Exports for ``platforms=["tpu"]`` (tpu_custom_call).
- ``"gpu"``: grid ``(T, Hkv, splits)``; a plain ``pl.pallas_call`` that gathers a block's rows from the pool
  in global memory by page id inside the kernel, written for the *Triton* lowering; runs with
  ``interpret=True`` on CPU; exports for ``["cuda"]`` with ``GPU_EXPORT_DISABLED_CHECKS``.
  Why Triton although JAX deprecates it in favour of Mosaic GPU: Mosaic GPU stages every blocked operand in
  shared memory (this kernel under it fails to lower: "Mosaic GPU kernel exceeds available shared memory:
  smem_bytes=1061896 > max_smem_bytes=232448"), its lowering rejects array indexers ("Arrays are not
  supported as indices."), so a page gather would be one TMA copy + barrier per page in a ``plgpu.kernel``
  (``pl.pallas_call`` on Mosaic GPU is itself deprecated), and its wgmma tiles want 64 query rows where a
  decode KV group has 3-4. The Triton lowering expresses the gather directly and lowers on CPU today; a
  Mosaic GPU port is the follow-up once a Hopper GPU can test it.

KV writes: this step's K/V never has to be in the pool for the kernel (the epilogue uses k_new/v_new), so
the write stays the jnp scatter ``specrag_jax.kernels.write_kv``: XLA updates the donated pool in place and
the write is independent of (can overlap) the attention; a fused Pallas write would only add aliasing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu_triton

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.kernels.pallas_decode_blocks import DecodeBlockSizes, block_sizes_for

_NEG = -1e30
BACKENDS = ("tpu", "gpu")
# jax.export refuses Triton kernels by default (no compatibility guarantee for this custom call).
GPU_EXPORT_DISABLED_CHECKS = (jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton"),)


def is_decode_step(meta: AttentionMetadata) -> bool:
    """Host-side check (concrete metadata): each valid token is its sequence's only token, parent -1."""
    valid = np.asarray(meta.token_valid)
    seqs = np.asarray(meta.token_seq)[valid]
    return bool(np.all(np.asarray(meta.parents)[valid] < 0) and len(np.unique(seqs)) == len(seqs))


def _split_range(length, lo, s, ps: int, ppb: int, num_splits: int):
    """Pages [start, end) of split ``s``: an even, block-aligned share of the active pages [lo/ps, len/ps).

    Non-negative operands only, so ``lax.div`` (truncating) avoids ``//``'s sign fix-up, which the Mosaic
    TPU lowering can only emit with a TPU attached.
    """
    div = jax.lax.div
    first = div(lo, ps)
    n_active = jnp.maximum(div(length + ps - 1, ps) - first, 0)
    share = div(div(n_active + num_splits - 1, num_splits) + ppb - 1, ppb) * ppb
    start = first + s * share
    end = jnp.minimum(first + n_active, start + share)
    return start, jnp.maximum(end, start)


def _attend_block(q, k, v, visible, carry, *, softcap: float | None, mxu: bool):
    """Online-softmax update of one KV group's (max, sum, acc) with one block of keys.

    q: [G, D] float32, scaled; k/v: [L, D] float32; visible: [L] bool. mxu: matmuls (TPU MXU); else
    broadcast-multiply-reduce, because Triton's dot needs >= 16 rows and a decode group has 3-4 q rows.
    """
    m_prev, l_prev, acc_prev = carry
    if mxu:
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    else:
        s = (q[:, None, :] * k[None, :, :]).sum(axis=2)
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)
    s = jnp.where(visible[None, :], s, _NEG)  # [G, L]
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    p = jnp.where(visible[None, :], jnp.exp(s - m_new), 0.0)
    alpha = jnp.exp(m_prev - m_new)
    if mxu:
        pv = jax.lax.dot_general(p, v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    else:
        pv = (p[:, :, None] * v[None, :, :]).sum(axis=1)
    return m_new, alpha * l_prev + p.sum(axis=1, keepdims=True), alpha * acc_prev + pv


def _init_carry(g: int, d: int):
    zeros = jnp.zeros((g, 1), jnp.float32)
    return zeros + _NEG, zeros, jnp.zeros((g, d), jnp.float32)


def _tpu_kernel(
    lens_ref,
    lo_ref,
    pt_ref,
    q_ref,
    k_hbm,
    v_hbm,
    o_ref,
    m_ref,
    l_ref,
    k_buf,
    v_buf,
    sems,
    *,
    ps: int,
    ppb: int,
    pages_per_seq: int,
    num_splits: int,
    hkv: int,
    g: int,
    d: int,
    scale: float,
    softcap: float | None,
) -> None:
    """One (token, split) cell: DMA page blocks HBM -> VMEM (double-buffered), all KV heads per page."""
    t, s = pl.program_id(0), pl.program_id(1)
    length, lo = lens_ref[t], lo_ref[t]
    start, end = _split_range(length, lo, s, ps, ppb, num_splits)
    num_blocks = jax.lax.div(end - start + ppb - 1, ppb)

    def copies(b, slot):
        descs = []
        for i in range(ppb):  # clamp to the last page of the split; the duplicates are masked out
            page = pt_ref[t * pages_per_seq + jnp.minimum(start + b * ppb + i, end - 1)]
            descs.append(pltpu.make_async_copy(k_hbm.at[page], k_buf.at[slot, i], sems.at[0, slot]))
            descs.append(pltpu.make_async_copy(v_hbm.at[page], v_buf.at[slot, i], sems.at[1, slot]))
        return descs

    @pl.when(num_blocks > 0)
    def _():
        for c in copies(0, 0):
            c.start()

    qs = [q_ref[h].astype(jnp.float32) * scale for h in range(hkv)]  # Hkv x [G, D]
    hi = jnp.minimum(length, end * ps)

    def body(b, carry):
        slot = jax.lax.rem(b, 2)

        @pl.when(b + 1 < num_blocks)
        def _():
            for c in copies(b + 1, 1 - slot):
                c.start()

        for c in copies(b, slot):
            c.wait()
        k = k_buf[slot].astype(jnp.float32).reshape(ppb * ps, hkv * d)
        v = v_buf[slot].astype(jnp.float32).reshape(ppb * ps, hkv * d)
        keys = (start + b * ppb) * ps + jax.lax.broadcasted_iota(jnp.int32, (ppb * ps,), 0)
        visible = (keys >= lo) & (keys < hi)
        return tuple(
            _attend_block(
                qs[h],
                k[:, h * d : (h + 1) * d],
                v[:, h * d : (h + 1) * d],
                visible,
                carry[h],
                softcap=softcap,
                mxu=True,
            )
            for h in range(hkv)
        )

    carry = jax.lax.fori_loop(0, num_blocks, body, tuple(_init_carry(g, d) for _ in range(hkv)))
    for h, (m, denom, acc) in enumerate(carry):
        o_ref[h], m_ref[h], l_ref[h] = acc, m, denom


def _gpu_kernel(
    lens_ref,
    lo_ref,
    pt_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_ref,
    l_ref,
    *,
    ps: int,
    ppb: int,
    num_splits: int,
    d: int,
    scale: float,
    softcap: float | None,
) -> None:
    """One (token, KV head, split) cell; k_ref/v_ref are the whole pool as [N * ps, Hkv * D] rows and a
    block's rows are gathered by page id straight from global memory."""
    t, h, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    length, lo = lens_ref[t], lo_ref[t]
    start, end = _split_range(length, lo, s, ps, ppb, num_splits)
    num_blocks = jax.lax.div(end - start + ppb - 1, ppb)
    q = q_ref[...].astype(jnp.float32) * scale  # [G, D]
    hi = jnp.minimum(length, end * ps)
    r = jax.lax.broadcasted_iota(jnp.int32, (ppb * ps,), 0)
    page_slot, offset = jax.lax.div(r, ps), jax.lax.rem(r, ps)

    def body(b, carry):
        first = start + b * ppb
        pages = pt_ref[t, jnp.minimum(first + page_slot, end - 1)]  # [L] page id of every row
        rows = pages * ps + offset
        k = k_ref[rows, pl.ds(h * d, d)].astype(jnp.float32)
        v = v_ref[rows, pl.ds(h * d, d)].astype(jnp.float32)
        keys = first * ps + r
        return _attend_block(q, k, v, (keys >= lo) & (keys < hi), carry, softcap=softcap, mxu=False)

    m_ref[...], l_ref[...], o_ref[...] = jax.lax.fori_loop(0, num_blocks, body, _init_carry(q.shape[0], d))


def _tpu_call(q4, k_flat, v_flat, lens, lo, pt, *, sizes: DecodeBlockSizes, scale, softcap, interpret):
    t, hkv, g, d = q4.shape
    ps, pages_per_seq = k_flat.shape[1], pt.shape[1]
    ppb = sizes.pages_per_block(ps, pages_per_seq)
    splits = sizes.num_splits(ps, pages_per_seq)
    kernel = functools.partial(
        _tpu_kernel,
        ps=ps,
        ppb=ppb,
        pages_per_seq=pages_per_seq,
        num_splits=splits,
        hkv=hkv,
        g=g,
        d=d,
        scale=scale,
        softcap=softcap,
    )

    def part(last):  # one split's partial of one token: [Hkv, G, last]
        return pl.BlockSpec((None, None, hkv, g, last), lambda i, j, *_: (i, j, 0, 0, 0))

    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(t, splits),
            in_specs=[
                pl.BlockSpec((None, hkv, g, d), lambda i, j, *_: (i, 0, 0, 0)),
                pl.BlockSpec(memory_space=pl.ANY),
                pl.BlockSpec(memory_space=pl.ANY),
            ],
            out_specs=[part(d), part(1), part(1)],
            scratch_shapes=[
                pltpu.VMEM((2, ppb, ps, hkv * d), k_flat.dtype),
                pltpu.VMEM((2, ppb, ps, hkv * d), v_flat.dtype),
                pltpu.SemaphoreType.DMA((2, 2)),
            ],
        ),
        out_shape=[jax.ShapeDtypeStruct((t, splits, hkv, g, n), jnp.float32) for n in (d, 1, 1)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="paged_decode_tpu",
    )(lens, lo, pt.reshape(-1), q4, k_flat, v_flat)


def _gpu_call(q4, k_flat, v_flat, lens, lo, pt, *, sizes: DecodeBlockSizes, scale, softcap, interpret):
    t, hkv, g, d = q4.shape
    n_pages, ps, hd = k_flat.shape
    ppb = sizes.pages_per_block(ps, pt.shape[1])
    splits = sizes.num_splits(ps, pt.shape[1])
    gp = pl.next_power_of_2(g)  # Triton tensors have power-of-2 sizes: pad the q group with zero rows
    q4 = jnp.pad(q4, ((0, 0), (0, 0), (0, gp - g), (0, 0)))
    kernel = functools.partial(_gpu_kernel, ps=ps, ppb=ppb, num_splits=splits, d=d, scale=scale, softcap=softcap)

    def whole(x):
        return pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)

    def part(last):  # one split's partial of one token and KV head: [Gp, last]
        return pl.BlockSpec((None, None, None, gp, last), lambda i, h, j: (i, j, h, 0, 0))

    k_rows, v_rows = k_flat.reshape(n_pages * ps, hd), v_flat.reshape(n_pages * ps, hd)
    outs = pl.pallas_call(
        kernel,
        grid=(t, hkv, splits),
        in_specs=[
            whole(lens),
            whole(lo),
            whole(pt),
            pl.BlockSpec((None, None, gp, d), lambda i, h, j: (i, h, 0, 0)),
            whole(k_rows),
            whole(v_rows),
        ],
        out_specs=[part(d), part(1), part(1)],
        out_shape=[jax.ShapeDtypeStruct((t, splits, hkv, gp, n), jnp.float32) for n in (d, 1, 1)],
        compiler_params=plgpu_triton.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name="paged_decode_gpu",
    )(lens, lo, pt, q4, k_rows, v_rows)
    return tuple(x[:, :, :, :g] for x in outs)


def _merge(acc, m, denom, q4, k_new, v_new, *, scale, softcap):
    """Flash-decoding reduce: combine split partials [T, S, Hkv, G, *] with the token's own K/V."""
    f32 = jnp.float32
    s_self = jnp.einsum("tkgd,tkd->tkg", q4.astype(f32) * scale, k_new.astype(f32))[..., None]
    if softcap is not None:
        s_self = softcap * jnp.tanh(s_self / softcap)
    m_all = jnp.maximum(m.max(axis=1), s_self)  # [T, Hkv, G, 1]
    w = jnp.exp(m - m_all[:, None])
    w_self = jnp.exp(s_self - m_all)
    num = (w * acc).sum(axis=1) + w_self * v_new.astype(f32)[:, :, None, :]
    return num / ((w * denom).sum(axis=1) + w_self)


def paged_decode_attention_pallas(
    q: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    meta: AttentionMetadata,
    *,
    scale: float,
    window: jax.Array | int = 0,
    softcap: float | None = None,
    backend: str | None = None,
    interpret: bool | None = None,
    block_sizes: DecodeBlockSizes | None = None,
) -> jax.Array:
    """Decode-step paged attention, equal to ``paged_tree_attention_reference`` on decode metadata.

    Args as the reference (q [T, Hq, D], k_new/v_new [T, Hkv, D], pools [N, page_size, Hkv, D]).
    backend: "tpu" | "gpu" (None: "tpu" on TPU, else "gpu"). interpret: None = on a CPU host.
    block_sizes: override the per-backend table (tests use tiny blocks to exercise splits and loops).
    Returns [T, Hq, D] in q's dtype; padding rows are zeros.
    """
    t, hq, d = q.shape
    n_pages, ps, hkv, dk = k_pool.shape
    if hq % hkv or dk != d or k_new.shape != (t, hkv, d) or v_pool.shape != k_pool.shape:
        raise SpecRagError(f"bad decode shapes q={q.shape} k_new={k_new.shape} pool={k_pool.shape}")
    if not isinstance(meta.parents, jax.core.Tracer) and not is_decode_step(meta):
        raise SpecRagError("paged_decode_attention_pallas needs a decode step (one token per sequence)")
    platform = jax.default_backend()
    backend = backend or ("tpu" if platform == "tpu" else "gpu")
    if backend not in BACKENDS:
        raise SpecRagError(f"unknown decode backend {backend!r}; choose one of {BACKENDS}")
    interpret = platform == "cpu" if interpret is None else interpret
    sizes = block_sizes or block_sizes_for(backend)

    g = hq // hkv
    q4 = q.reshape(t, hkv, g, d)
    valid = meta.token_valid
    lens = jnp.where(valid, meta.kv_lens[meta.token_seq], 0).astype(jnp.int32)
    window = jnp.asarray(window, jnp.int32)
    lo = jnp.where(window > 0, jnp.maximum(meta.positions - window + 1, 0), 0).astype(jnp.int32)
    pt = meta.page_table[meta.token_seq].astype(jnp.int32)  # [T, P]: each token's own page row
    k_flat = k_pool.reshape(n_pages, ps, hkv * d)  # free reshape: one page = one [ps, Hkv*D] tile
    v_flat = v_pool.reshape(n_pages, ps, hkv * d)
    call = _tpu_call if backend == "tpu" else _gpu_call
    acc, m, denom = call(
        q4, k_flat, v_flat, lens, lo, pt, sizes=sizes, scale=scale, softcap=softcap, interpret=interpret
    )
    out = _merge(acc, m, denom, q4, k_new, v_new, scale=scale, softcap=softcap)
    return jnp.where(valid[:, None, None], out.reshape(t, hq, d), 0).astype(q.dtype)
