"""ShardedDenseIndex on the test process's single device: same results as DenseIndex, clear input errors."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.parallel import Placement
from specrag_jax.parallel.dense import ShardedDenseIndex
from specrag_jax.retrieval.dense import DenseIndex


def test_single_device_sharded_index_matches_and_validates():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(37, 8)).astype(np.float32)
    index = DenseIndex([{"id": str(i), "title": "", "text": "x"} for i in range(37)], emb, model="m", mean=emb.mean(0))
    sharded = ShardedDenseIndex(index, Placement.from_spec("model=1"))
    q = rng.normal(size=8).astype(np.float32)
    got, want = sharded.search_vector(q, 50), index.search_vector(q, 50)  # n > docs: every document, ranked
    assert [i for i, _ in got] == [i for i, _ in want] and len(got) == 37
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
    with pytest.raises(SpecRagError, match="must be >= 1"):
        sharded.search_vector(q, 0)
    with pytest.raises(SpecRagError, match="the index has 8 dims"):
        sharded.search_vectors(np.zeros((2, 5), np.float32))
