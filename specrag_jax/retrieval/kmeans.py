"""k-means in JAX: k-means++ seeding and Lloyd iterations in one jitted ``lax.while_loop``.

Points are padded to a power-of-two count (padding rows carry weight 0), so questions with 10, 12 or 15
retrieved documents share one compiled program. ``n_init`` seedings run side by side under ``vmap`` and the
lowest-inertia run wins. ``k`` is clamped to the number of distinct points (with a note), so every cluster
is non-empty: k-means++ never picks a point at distance 0 from a chosen centre, and Lloyd keeps a centre
whose cluster empties where it was.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.executor.packing import bucket


@dataclasses.dataclass(frozen=True)
class KMeansResult:
    labels: np.ndarray  # [N] int, cluster of each point, 0..k-1, every cluster non-empty
    centroids: np.ndarray  # [k, H] float32
    k: int  # clusters actually used (may be less than requested; see note)
    inertia: float  # sum of squared distances to the assigned centroids
    iterations: int  # Lloyd iterations of the winning run
    note: str | None = None  # why k differs from the request, if it does


def _sq_dists(x: jax.Array, c: jax.Array) -> jax.Array:
    """[N, K] squared Euclidean distances (clamped at 0 against cancellation)."""
    d = jnp.sum(x * x, 1)[:, None] - 2.0 * x @ c.T + jnp.sum(c * c, 1)[None, :]
    return jnp.maximum(d, 0.0)


def _kmeans_pp(key: jax.Array, x: jax.Array, w: jax.Array, k: int) -> jax.Array:
    """k-means++: first centre uniform over real points, then each with probability proportional to D^2."""
    key, sub = jax.random.split(key)
    first = jax.random.categorical(sub, jnp.where(w > 0, 0.0, -jnp.inf))
    centroids = jnp.zeros((k, x.shape[1]), x.dtype).at[0].set(x[first])
    d2 = jnp.sum((x - x[first]) ** 2, 1)

    def body(i, carry):
        centroids, d2, key = carry
        key, sub = jax.random.split(key)
        p = d2 * w
        logits = jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf)
        # All remaining distances 0 cannot happen after the k clamp; guard anyway (uniform over real points).
        logits = jnp.where(jnp.any(p > 0), logits, jnp.where(w > 0, 0.0, -jnp.inf))
        j = jax.random.categorical(sub, logits)
        centroids = centroids.at[i].set(x[j])
        return centroids, jnp.minimum(d2, jnp.sum((x - x[j]) ** 2, 1)), key

    centroids, _, _ = jax.lax.fori_loop(1, k, body, (centroids, d2, key))
    return centroids


def _lloyd(x: jax.Array, w: jax.Array, centroids: jax.Array, max_iters: int, tol: jax.Array):
    k = centroids.shape[0]

    def assign(c):
        return jnp.argmin(_sq_dists(x, c), axis=1)

    def cond(state):
        _, it, shift = state
        return (it < max_iters) & (shift > tol)

    def body(state):
        c, it, _ = state
        onehot = jax.nn.one_hot(assign(c), k, dtype=x.dtype) * w[:, None]  # [N, K]
        counts = onehot.sum(0)
        sums = onehot.T @ x
        new = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], c)  # empty: stay
        return new, it + 1, jnp.sum((new - c) ** 2)

    c, iters, _ = jax.lax.while_loop(cond, body, (centroids, jnp.int32(0), jnp.float32(jnp.inf)))
    labels = assign(c)
    inertia = jnp.sum(jnp.min(_sq_dists(x, c), axis=1) * w)
    return c, labels, inertia, iters


@functools.partial(jax.jit, static_argnames=("k", "n_init", "max_iters"))
def _kmeans_jit(key, x, w, tol, *, k, n_init, max_iters):
    real = jnp.sum(w)
    mean = jnp.sum(x * w[:, None], 0) / real
    scale = jnp.sum(((x - mean) ** 2) * w[:, None]) / (real * x.shape[1])  # mean per-dimension variance
    tol_abs = tol * scale * x.shape[1]

    def run(key):
        return _lloyd(x, w, _kmeans_pp(key, x, w, k), max_iters, tol_abs)

    c, labels, inertia, iters = jax.vmap(run)(jax.random.split(key, n_init))
    best = jnp.argmin(inertia)
    return c[best], labels[best], inertia[best], iters[best]


def kmeans(points, k: int, *, seed: int = 0, n_init: int = 4, max_iters: int = 100, tol: float = 1e-6) -> KMeansResult:
    """Cluster ``points`` [N, H] into ``k`` groups (same seed, same result).

    ``tol``: stop when the squared centroid shift falls below ``tol`` x the data's total variance.
    """
    x = np.asarray(points, np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise SpecRagError(f"k-means needs a non-empty [N, H] array of points (got shape {x.shape})")
    if not np.all(np.isfinite(x)):
        raise SpecRagError("k-means points contain NaN or infinity")
    if k < 1:
        raise SpecRagError(f"number of clusters k must be >= 1 (got {k})")
    if n_init < 1 or max_iters < 1:
        raise SpecRagError(f"n_init and max_iters must be >= 1 (got {n_init}, {max_iters})")
    n = x.shape[0]
    distinct = len(np.unique(x, axis=0))
    note = None
    k_used = min(k, distinct)
    if k_used < k:
        why = f"only {n} points" if distinct == n else f"only {distinct} distinct points among {n}"
        note = f"k={k} clamped to {k_used}: {why}"
    if k_used == 1:  # nothing to iterate
        centroid = x.mean(0, keepdims=True)
        inertia = float(((x - centroid) ** 2).sum())
        return KMeansResult(np.zeros(n, np.int64), centroid, 1, inertia, 0, note)
    n_pad = bucket(n, 16)
    xp = np.zeros((n_pad, x.shape[1]), np.float32)
    xp[:n] = x
    w = np.zeros(n_pad, np.float32)
    w[:n] = 1.0
    c, labels, inertia, iters = _kmeans_jit(
        jax.random.PRNGKey(seed), xp, w, jnp.float32(tol), k=k_used, n_init=n_init, max_iters=max_iters
    )
    labels = np.asarray(labels)[:n]
    used, labels = np.unique(labels, return_inverse=True)  # relabel 0..k'-1 (a cluster can empty in Lloyd)
    if len(used) < k_used:
        note = (note + "; " if note else "") + f"{k_used - len(used)} cluster(s) emptied during Lloyd iterations"
    return KMeansResult(labels.astype(np.int64), np.asarray(c)[used], len(used), float(inertia), int(iters), note)
