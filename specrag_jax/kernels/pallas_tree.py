"""Pallas tree/prefill attention over a paged KV pool (same semantics as ``paged_tree_attention_reference``).

Design: queries are tiled in packed order (``q`` tokens per block, a block may mix sequences); for each query
block the kernel runs a flash-style online softmax over two *work lists* built by ``tree_plan``: prefix KV
blocks (whole pages read through the page table) and chunk-key blocks (this step's K/V). Blocks that the
mask hides entirely are not in the lists, so they are neither loaded nor computed: prefix blocks past
``kv_len`` or wholly outside the sliding window, chunk blocks holding no ancestor of any query in the block
(other branches, other sequences, padding). Inside a visited block the exact mask is rebuilt from O(T)
per-token data: sequence, position and the preorder interval ``[tin, tend)`` (see ``tree_plan``); scores
are soft-capped, masked and folded into running (max, sum, acc) in float32; padding rows end with sum 0
and are written as zeros. Block sizes: ``tree_block_sizes`` (per backend; prefix blocks are whole pages).

Two variants:
- ``tpu``: ``pltpu.PrefetchScalarGridSpec`` puts work lists, page table, kv_lens and window in SMEM; pools and
  step K/V stay in HBM (``pl.ANY``) and pages are DMA'd (``pltpu.make_async_copy``) one page per copy into
  double-buffered VMEM slots, the next block's copies in flight while the current one is computed. Grid
  (kv_head, query block); the ``g = Hq/Hkv`` query heads of a KV head share each K/V tile (GQA/MQA).
  Runs on CPU under TPU interpret mode (``interpret=pltpu.InterpretParams()``).
- ``gpu``: a plain ``pl.pallas_call`` that gathers K/V rows from the pool inside the kernel (no DMA
  descriptors), grid (q_head, query block), lowered with **Triton** compiler params. Why Triton and not
  Mosaic GPU: the kernel is driven by data-dependent scalar reads (work lists, page ids) and row gathers
  from a pool in global memory, which Triton expresses directly as pointer loads and which run on any
  GPU from Ampere on. Mosaic GPU wants every operand staged through SMEM with TMA copies whose sizes are
  multiples of the warpgroup (a 32-byte page-table block already fails: "Only copies transferring a number
  of bytes divisible by the warpgroup size are supported"), and in JAX 0.10 ``pl.pallas_call`` for Mosaic
  GPU is itself deprecated in favour of ``plgpu.kernel`` (Hopper+ only). A Mosaic GPU port would be a
  separate warp-specialised kernel. Exporting the Triton call needs
  ``DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")``. Runs on CPU with ``interpret=True``.
One portable kernel is not possible: DMA/semaphore primitives have no GPU lowering and a whole-pool
BlockSpec (the gather variant) would have to fit in TPU VMEM.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.kernels.pallas_tree_kernels import call_gpu, call_tpu
from specrag_jax.kernels.tree_block_sizes import choose_blocks
from specrag_jax.kernels.tree_plan import TreePlan, build_tree_plan, skip_stats


def _default_backend() -> str:
    platform = jax.default_backend()
    return "tpu" if platform == "tpu" else "gpu" if platform in ("gpu", "cuda", "rocm") else "cpu"


def paged_tree_attention_pallas(
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
    tree: bool = True,
    backend: str | None = None,
    interpret: bool | None = None,
    block_sizes: dict[str, int] | None = None,
    plan: TreePlan | None = None,
) -> jax.Array:
    """Pallas version of ``paged_tree_attention_reference`` (same arguments and result).

    backend: "tpu" (scalar prefetch + DMA kernel) or "gpu" (in-kernel gather, Triton); default: the JAX
    platform, and on CPU the "gpu" variant interpreted. interpret: default True on CPU. block_sizes overrides
    the table entries ("q", "chunk", "kv"); plan: a prebuilt ``tree_plan_for`` result, shared across layers;
    it must come from the same metadata, window and tree flag (the kernel reads the window from the plan).
    """
    platform = _default_backend()
    backend = backend or ("tpu" if platform == "tpu" else "gpu")
    if backend not in ("tpu", "gpu"):
        raise SpecRagError(f"unknown pallas tree backend {backend!r}; choose 'tpu' or 'gpu'")
    interpret = (platform == "cpu") if interpret is None else interpret
    t, hq, d = q.shape
    hkv = k_new.shape[1]
    if hq % hkv:
        raise SpecRagError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    g = hq // hkv
    if plan is None:
        plan = tree_plan_for(
            meta,
            k_pool.shape[1],
            window=window,
            tree=tree,
            backend=backend,
            interpret=interpret,
            block_sizes=block_sizes,
        )
    if plan.blocks.page_size != k_pool.shape[1] or plan.t_pad < t:
        raise SpecRagError(
            f"tree plan built for page size {plan.blocks.page_size} and <= {plan.t_pad} tokens, "
            f"got page size {k_pool.shape[1]} and {t} tokens"
        )
    pad = plan.t_pad - t
    qt = jnp.pad(q, ((0, pad), (0, 0), (0, 0))).transpose(1, 0, 2)  # [Hq, T_pad, D]
    k_new = jnp.pad(k_new, ((0, pad), (0, 0), (0, 0)))
    v_new = jnp.pad(v_new, ((0, pad), (0, 0), (0, 0)))
    prec = lax.Precision.HIGHEST if q.dtype == jnp.float32 else lax.Precision.DEFAULT
    kw = dict(g=g, scale=float(scale), softcap=softcap, prec=prec, interpret=interpret)
    if backend == "tpu":
        out = call_tpu(qt.reshape(hkv, g, plan.t_pad, d), k_new, v_new, k_pool, v_pool, plan, **kw)
        out = out.reshape(hq, plan.t_pad, d)
    else:
        out = call_gpu(qt, k_new, v_new, k_pool, v_pool, plan, **kw)
    return out.transpose(1, 0, 2)[:t]


def tree_plan_for(
    meta: AttentionMetadata,
    page_size: int,
    *,
    window: jax.Array | int = 0,
    tree: bool = True,
    backend: str | None = None,
    interpret: bool | None = None,
    block_sizes: dict[str, int] | None = None,
) -> TreePlan:
    """The kernel's work lists and compact mask for ``meta`` (block sizes from the backend's table)."""
    platform = _default_backend()
    interpret = (platform == "cpu") if interpret is None else interpret
    table = "cpu" if interpret else (backend or platform)
    blocks = choose_blocks(table, meta.token_seq.shape[0], page_size, block_sizes)
    return _build_plan_jit(meta, blocks, window=window, tree=tree)


_build_plan_jit = jax.jit(build_tree_plan, static_argnames=("blocks", "tree"))


def tree_skip_fraction(
    meta: AttentionMetadata,
    page_size: int,
    *,
    window: int = 0,
    tree: bool = True,
    backend: str = "tpu",
    block_sizes: dict[str, int] | None = None,
) -> dict[str, float]:
    """Fraction of KV blocks the kernel skips for ``meta`` (vs. a dense blockwise kernel); see skip_stats."""
    return skip_stats(
        tree_plan_for(
            meta, page_size, window=window, tree=tree, backend=backend, interpret=False, block_sizes=block_sizes
        )
    )
