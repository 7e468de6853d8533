"""A dense retrieval index whose document vectors are split over devices, with an exact global top-k.

Rows are spread over the mesh axes of the ``docs`` rule (default: every device); each device scores its
rows and keeps its local top-k, the candidates (k per device) are all-gathered and merged by
(score desc, document index asc): the same order as ``DenseIndex.search_vector``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specrag_jax.errors import SpecRagError
from specrag_jax.parallel.placement import Placement, put_global
from specrag_jax.retrieval.dense import DenseIndex


class ShardedDenseIndex:
    """``DenseIndex`` search with the prepared (centred, normalised) vectors sharded by rows."""

    def __init__(self, index: DenseIndex, placement: Placement) -> None:
        self.index = index
        self.placement = placement
        mesh = placement.mesh
        rule = placement.rules.get("docs")
        axes = tuple(a for a in ((rule,) if isinstance(rule, str) else (rule or ())) if a in mesh.shape)
        self.axes = axes
        self.num_shards = math.prod(mesh.shape[a] for a in axes)
        n, h = index.vectors.shape
        self.rows_per_shard = -(-n // self.num_shards)
        padded = np.zeros((self.rows_per_shard * self.num_shards, h), np.float32)
        padded[:n] = index.vectors
        self.vectors = put_global(padded, NamedSharding(mesh, P(axes or None, None)))
        self._search = {}

    def __len__(self) -> int:
        return len(self.index)

    def _fn(self, k: int):
        if k not in self._search:
            mesh, axes = self.placement.mesh, self.axes
            body = functools.partial(
                _local_topk,
                k=k,
                k_local=min(k, self.rows_per_shard),
                rows=self.rows_per_shard,
                total=len(self.index),
                axes=axes,
            )
            sm = jax.shard_map(
                body, mesh=mesh, in_specs=(P(axes or None, None), P()), out_specs=(P(), P()), check_vma=False
            )
            self._search[k] = jax.jit(sm, out_shardings=(self.placement.replicated,) * 2)
        return self._search[k]

    def search_vectors(self, vectors: np.ndarray, n: int = 10) -> list[list[tuple[int, float]]]:
        """Top-``n`` documents for each raw query embedding of ``vectors`` [B, H], best first."""
        if n < 1:
            raise SpecRagError(f"number of documents to retrieve must be >= 1 (got {n})")
        q = np.asarray(vectors, np.float32)
        if q.ndim != 2 or q.shape[1] != self.index.dim:
            raise SpecRagError(f"query embeddings of shape {q.shape}; the index has {self.index.dim} dims")
        q = self.index.prepare(q)
        k = min(n, len(self.index))
        ids, scores = self._fn(k)(self.vectors, put_global(q, self.placement.replicated))
        ids, scores = np.asarray(ids)[:, :k], np.asarray(scores)[:, :k]
        return [[(int(i), float(s)) for i, s in zip(ri, rs)] for ri, rs in zip(ids, scores)]

    def search_vector(self, vector: np.ndarray, n: int = 10) -> list[tuple[int, float]]:
        """Same contract as ``DenseIndex.search_vector``."""
        return self.search_vectors(np.asarray(vector, np.float32).reshape(1, -1), n)[0]


def _merge(scores: jax.Array, ids: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Top-k of candidate rows [B, C] by (score desc, id asc): a two-key sort, so ties break like numpy."""
    neg, ids = jax.lax.sort((-scores, ids), dimension=1, num_keys=2)
    return ids[:, :k], -neg[:, :k]


def _local_topk(vectors, queries, *, k: int, k_local: int, rows: int, total: int, axes: tuple[str, ...]):
    shard = jax.lax.axis_index(axes) if axes else 0
    scores = queries @ vectors.T  # [B, rows]
    ids = shard * rows + jnp.arange(rows, dtype=jnp.int32)[None, :]
    scores = jnp.where(ids < total, scores, -jnp.inf)  # padding rows never win
    ids = jnp.broadcast_to(ids, scores.shape)
    local_ids, local_scores = _merge(scores, ids, k_local)
    if not axes:
        return local_ids[:, :k], local_scores[:, :k]
    all_ids = jax.lax.all_gather(local_ids, axes, axis=1, tiled=True)  # [B, k * shards]
    all_scores = jax.lax.all_gather(local_scores, axes, axis=1, tiled=True)
    return _merge(all_scores, all_ids, k)
