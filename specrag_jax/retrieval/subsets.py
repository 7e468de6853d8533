"""Document subsets for drafting (the paper's Algorithm 1): one document from every cluster, m unique subsets.

Each subset takes one document, uniformly at random, from each cluster, so it covers every perspective
the clustering found while keeping the drafter's prompt short. Subsets are sets: a subset is returned with
its document indices in ascending order (retrieval rank order, when documents are indexed by rank), and a
subset drawn twice counts once. When fewer than m distinct subsets exist (the product of the cluster
sizes), all of them are returned and the result says so.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError

_ENUMERATE_LIMIT = 100_000  # below this many possible subsets, sample without replacement by index


@dataclasses.dataclass(frozen=True)
class SubsetSample:
    subsets: list[tuple[int, ...]]  # each: one document index per cluster, ascending
    requested: int  # m
    num_possible: int  # product of the cluster sizes
    note: str | None = None  # set when fewer than m subsets could be formed

    @property
    def exhausted(self) -> bool:
        """True when every possible subset was returned (fewer than requested existed)."""
        return len(self.subsets) < self.requested


def sample_subsets(labels: Sequence[int] | np.ndarray, m: int, *, seed: int = 0) -> SubsetSample:
    """``m`` unique subsets with exactly one document (index into ``labels``) from each cluster.

    ``labels[i]`` is the cluster of document ``i`` (any integers). Same seed, same subsets, same order.
    """
    labels = np.asarray(labels)
    if m < 1:
        raise SpecRagError(f"number of subsets m must be >= 1 (got {m})")
    if labels.ndim != 1 or labels.size == 0:
        raise SpecRagError("subset sampling needs a non-empty list of cluster labels")
    clusters = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    sizes = [len(c) for c in clusters]
    total = math.prod(sizes)
    rng = np.random.default_rng(seed)
    if total <= m:
        subsets = [tuple(sorted(int(i) for i in combo)) for combo in itertools.product(*clusters)]
        order = rng.permutation(len(subsets))
        subsets = [subsets[j] for j in order]
        note = None
        if total < m:
            note = (
                f"only {total} distinct subsets exist ({len(clusters)} clusters of sizes {sizes}); "
                f"returning all of them instead of {m}"
            )
        return SubsetSample(subsets, m, total, note)
    if total <= _ENUMERATE_LIMIT:
        # Mixed-radix decoding of m distinct subset numbers: uniform, without replacement, no rejection.
        picks = rng.choice(total, size=m, replace=False)
        subsets = []
        for code in picks:
            chosen = []
            for members, size in zip(clusters, sizes):
                code, r = divmod(int(code), size)
                chosen.append(int(members[r]))
            subsets.append(tuple(sorted(chosen)))
        return SubsetSample(subsets, m, total)
    # Huge space: draw one member per cluster and reject repeats (collisions are rare here).
    seen: set[tuple[int, ...]] = set()
    subsets = []
    while len(subsets) < m:
        subset = tuple(sorted(int(c[rng.integers(len(c))]) for c in clusters))
        if subset not in seen:
            seen.add(subset)
            subsets.append(subset)
    return SubsetSample(subsets, m, total)


def cover_subsets(labels: Sequence[int] | np.ndarray, m: int, k: int) -> SubsetSample:
    """Up to ``m`` unique subsets that together hold every document, each of ``max(k, ceil(n / m))`` documents.

    The documents are ordered by dealing the clusters round-robin (each cluster's documents in index order, i.e.
    retrieval rank), then subset ``i`` takes the next window of that order (wrapping around), so subsets mix the
    clusters while each cluster has documents left, and every document is read by some draft. Deterministic; windows
    that repeat a subset (fewer documents than ``m * k``) count once, and the note says so; ``num_possible`` is the
    number of distinct subsets returned. A subset holds ``n / m`` documents or more: few drafts over many passages
    make long drafter prompts (bounded by the drafter's context)."""
    labels = np.asarray(labels)
    if m < 1 or k < 1:
        raise SpecRagError(f"covering subsets need m >= 1 and k >= 1 (got m={m}, k={k})")
    if labels.ndim != 1 or labels.size == 0:
        raise SpecRagError("subset sampling needs a non-empty list of cluster labels")
    clusters = [list(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    order = [int(c[i]) for i in range(max(map(len, clusters))) for c in clusters if i < len(c)]
    n = len(order)
    size = min(max(k, math.ceil(n / m)), n)
    subsets: list[tuple[int, ...]] = []
    for i in range(m):
        subset = tuple(sorted({order[(i * size + t) % n] for t in range(size)}))
        if subset not in subsets:
            subsets.append(subset)
    note = None
    if len(subsets) < m:
        note = f"only {len(subsets)} distinct covering subsets of {size} of {n} documents; returning them for {m}"
    return SubsetSample(subsets, m, len(subsets), note)
