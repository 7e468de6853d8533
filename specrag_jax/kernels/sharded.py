"""Paged attention under ``jax.shard_map`` over heads: each device runs the kernel on its own heads.

It lives with the kernels (not in ``parallel``) because the decoder calls it: ``models`` imports ``kernels``
and never ``parallel``, which sits above ``models`` (its rules and placements know the parameter tree).

A Pallas kernel is an opaque custom call to XLA's partitioner (it would gather every operand onto every
device); inside ``shard_map`` each device instead sees its own slice: K/V heads and their query-head groups
when the KV heads divide over the axis, or (one KV head, as in Gemma 3 270M) the query heads with the
single K/V head replicated. Page tables and metadata are replicated; the result stays split over heads.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from specrag_jax.kernels import paged_attention


def head_split(num_heads: int, num_kv_heads: int, n: int) -> str | None:
    """How heads split n ways: "kv" (K/V heads and their query groups), "q" (one KV head), or None."""
    if n > 1 and num_kv_heads % n == 0:
        return "kv"
    if n > 1 and num_kv_heads == 1 and num_heads % n == 0:
        return "q"
    return None


def sharded_paged_attention(
    q, k_new, v_new, k_pool, v_pool, meta, *, mesh: Mesh, axis: str = "model", **kwargs
) -> jax.Array:
    """``paged_attention`` (same arguments; ``impl`` and options in kwargs) with heads split over ``axis``.

    Falls back to the plain call when the heads do not split over the axis. ``check_vma=False``: Pallas
    calls carry no varying-manual-axes annotations.
    """
    n = mesh.shape.get(axis, 1)
    mode = head_split(q.shape[1], k_new.shape[1], n)
    if mode is None:
        return paged_attention(q, k_new, v_new, k_pool, v_pool, meta, **kwargs)
    heads = P(None, axis, None)
    kv = heads if mode == "kv" else P()
    pool = P(None, None, axis, None) if mode == "kv" else P()
    plan = kwargs.pop("plan", None)
    body = functools.partial(_local, **kwargs)
    fn = jax.shard_map(
        body, mesh=mesh, in_specs=(heads, kv, kv, pool, pool, P(), P()), out_specs=heads, check_vma=False
    )
    return fn(q, k_new, v_new, k_pool, v_pool, meta, plan)


def _local(q, k_new, v_new, k_pool, v_pool, meta, plan, **kwargs):
    return paged_attention(q, k_new, v_new, k_pool, v_pool, meta, plan=plan, **kwargs)
