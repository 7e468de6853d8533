"""Subset sampling (Algorithm 1): unique subsets, one document per cluster, seeded, exhaustion reported."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval import sample_subsets


def check_one_per_cluster(subsets, labels):
    clusters = sorted(set(labels))
    for s in subsets:
        assert list(s) == sorted(s)
        assert sorted(labels[i] for i in s) == clusters


def test_unique_one_per_cluster_and_seeded():
    labels = [0, 1, 0, 2, 1, 0, 2, 2, 1, 0]  # sizes 4, 3, 3: 36 possible
    result = sample_subsets(labels, 10, seed=3)
    assert len(result.subsets) == 10 and len(set(result.subsets)) == 10
    assert result.num_possible == 36 and result.note is None and not result.exhausted
    check_one_per_cluster(result.subsets, labels)
    assert sample_subsets(labels, 10, seed=3).subsets == result.subsets
    assert sample_subsets(labels, 10, seed=4).subsets != result.subsets


def test_fewer_possible_than_m_returns_all():
    labels = np.array([5, 5, 9])  # 2 possible subsets: {0, 2}, {1, 2}
    result = sample_subsets(labels, 5)
    assert sorted(result.subsets) == [(0, 2), (1, 2)]
    assert result.exhausted and result.num_possible == 2
    assert "only 2 distinct subsets" in result.note
    exact = sample_subsets(labels, 2)
    assert sorted(exact.subsets) == [(0, 2), (1, 2)] and exact.note is None
    single = sample_subsets([0, 0, 0], 2)  # k = 1: subsets are single documents
    assert len(single.subsets) == 2 and all(len(s) == 1 for s in single.subsets)


def test_large_space_uses_rejection_and_stays_unique():
    labels = np.repeat(np.arange(6), 10)  # 10**6 possible subsets
    result = sample_subsets(labels, 50, seed=0)
    assert result.num_possible == math.prod([10] * 6)
    assert len(set(result.subsets)) == 50
    check_one_per_cluster(result.subsets, labels.tolist())


def test_out_of_range():
    with pytest.raises(SpecRagError, match="m must be >= 1"):
        sample_subsets([0, 1], 0)
    with pytest.raises(SpecRagError, match="non-empty"):
        sample_subsets([], 3)
