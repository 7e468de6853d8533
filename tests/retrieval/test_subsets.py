"""Subset sampling (Algorithm 1): unique subsets, one document per cluster, seeded, exhaustion reported; covering
subsets: together every document."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval import cover_subsets, sample_subsets


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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.integers(1, 12), st.integers(1, 6))
def test_cover_subsets_hold_every_document(labels, m, k):
    """Random and adversarial labels (one cluster, all singletons, fewer documents than m * k)."""
    sample = cover_subsets(labels, m, k)
    n = len(labels)
    size = min(max(k, -(-n // m)), n)
    assert set().union(*map(set, sample.subsets)) == set(range(n))  # every document is read by some draft
    assert len(set(sample.subsets)) == len(sample.subsets) <= m
    assert all(len(s) == size and list(s) == sorted(s) for s in sample.subsets)
    assert (sample.note is not None) == (len(sample.subsets) < m)
    assert cover_subsets(labels, m, k) == sample  # deterministic


def test_cover_subsets_mix_the_clusters():
    labels = [0] * 20 + [1] * 20  # two clusters of 20 (40 passages), five drafts of eight
    sample = cover_subsets(labels, 5, 2)
    assert len(sample.subsets) == 5 and all(len(s) == 8 for s in sample.subsets)
    assert all(sum(i < 20 for i in s) == 4 for s in sample.subsets)  # half from each cluster
    assert cover_subsets([0] * 10, 5, 2).subsets == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    with pytest.raises(SpecRagError):
        cover_subsets([0, 1], 0, 2)
