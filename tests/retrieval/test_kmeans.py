"""JAX k-means: recovers separated blobs, is reproducible, and handles k > N, duplicates and k = 1."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval import kmeans


def adjusted_rand_index(a, b) -> float:
    """ARI from the contingency table (1.0 = identical partitions up to renaming)."""
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1))
    np.add.at(table, (ai, bi), 1)
    comb = lambda x: x * (x - 1) / 2  # noqa: E731
    sum_ij = comb(table).sum()
    sum_a, sum_b = comb(table.sum(1)).sum(), comb(table.sum(0)).sum()
    expected = sum_a * sum_b / comb(len(a))
    return float((sum_ij - expected) / (0.5 * (sum_a + sum_b) - expected))


def blobs(seed=0, per=20, dim=8):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 10, (3, dim))
    truth = np.repeat(np.arange(3), per)
    points = centres[truth] + rng.normal(0, 0.5, (3 * per, dim))
    order = rng.permutation(len(truth))
    return points[order].astype(np.float32), truth[order]


def test_recovers_three_blobs():
    points, truth = blobs()
    result = kmeans(points, 3, seed=1)
    assert result.k == 3 and result.note is None
    assert adjusted_rand_index(result.labels, truth) == pytest.approx(1.0)
    assert result.centroids.shape == (3, 8)
    for c in range(3):  # each centroid is its cluster's mean
        np.testing.assert_allclose(result.centroids[c], points[result.labels == c].mean(0), atol=1e-4)
    assert 1 <= result.iterations < 100


def test_seeded_reproducibility():
    points = np.random.default_rng(3).normal(size=(25, 6)).astype(np.float32)  # no clear structure
    a, b = kmeans(points, 4, seed=7), kmeans(points, 4, seed=7)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.centroids, b.centroids)
    seeds = {tuple(kmeans(points, 4, seed=s).labels) for s in range(6)}
    assert len(seeds) > 1  # the seed matters on unstructured data


def test_k_larger_than_n_is_clamped_with_note():
    points = np.eye(3, dtype=np.float32)
    result = kmeans(points, 5)
    assert result.k == 3 and "clamped to 3" in result.note
    assert sorted(result.labels.tolist()) == [0, 1, 2]


def test_duplicates_and_k1():
    points = np.array([[1, 1], [1, 1], [1, 1], [5, 5], [5, 5]], np.float32)
    result = kmeans(points, 4)
    assert result.k == 2 and "2 distinct points" in result.note
    assert result.labels[0] == result.labels[1] == result.labels[2] != result.labels[3] == result.labels[4]
    assert result.inertia == pytest.approx(0.0, abs=1e-5)
    one = kmeans(points, 1)
    assert one.k == 1 and one.note is None and set(one.labels.tolist()) == {0}
    np.testing.assert_allclose(one.centroids[0], points.mean(0))
    same = kmeans(np.ones((4, 3), np.float32), 2)
    assert same.k == 1 and set(same.labels.tolist()) == {0}


def test_bad_arguments():
    with pytest.raises(SpecRagError, match="k must be >= 1"):
        kmeans(np.ones((3, 2)), 0)
    with pytest.raises(SpecRagError, match="non-empty"):
        kmeans(np.zeros((0, 2)), 2)
    with pytest.raises(SpecRagError, match="NaN"):
        kmeans(np.array([[np.nan, 0.0], [1.0, 1.0]]), 2)
