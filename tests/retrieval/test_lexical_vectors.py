"""Hashed TF-IDF rows: unit length, stable across processes, topic structure k-means can find, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.clustering import lexical_subsets
from specrag_jax.retrieval.lexical_vectors import hashed_tfidf, term_bucket

CATS = [
    "Cats purr when content and sleep most of the day.",
    "A cat grooms its fur with a rough tongue; cats purr too.",
    "Kittens and cats hunt mice and sleep in the sun.",
]
DATABASES = [
    "A database index speeds up queries over large tables.",
    "SQL queries join tables; an index avoids scanning every row of a database.",
    "Transactions keep a database consistent when queries run at once.",
]


def test_rows_are_unit_length_and_deterministic():
    texts = CATS + DATABASES
    x = hashed_tfidf(texts)
    assert x.shape == (6, 2048) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(x, hashed_tfidf(texts))
    assert hashed_tfidf(["the and of", "cats purr"])[0].sum() == 0.0  # stop words only: a zero row


def test_term_bucket_is_crc32_not_python_hash():
    h = zlib.crc32(b"purr")
    assert term_bucket("purr", 2048) == (h % 2048, 1.0 if h < 2**31 else -1.0)
    # another process (another PYTHONHASHSEED) computes the same vectors
    code = (
        "from specrag_jax.retrieval.lexical_vectors import hashed_tfidf\n"
        "print(hashed_tfidf(['cats purr a lot']).tobytes().hex())"
    )
    env = {**os.environ}
    runs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "PYTHONHASHSEED": s}, check=True
        ).stdout
        for s in ("1", "2")
    }
    assert len(runs) == 1 and runs.pop().strip() == hashed_tfidf(["cats purr a lot"]).tobytes().hex()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(alphabet="abcdefgh .", min_size=0, max_size=40), min_size=1, max_size=12), st.integers(1, 64))
def test_any_texts_give_finite_unit_or_zero_rows(texts, dim):
    x = hashed_tfidf(texts, dim)
    norms = np.linalg.norm(x, axis=1)
    assert x.shape == (len(texts), dim) and np.all(np.isfinite(x))
    assert np.all((np.abs(norms - 1.0) < 1e-5) | (norms == 0.0))


def test_same_topic_rows_are_closer():
    x = hashed_tfidf(CATS + DATABASES)
    sim = x @ x.T
    within = min(sim[0, 1], sim[0, 2], sim[1, 2], sim[3, 4], sim[3, 5], sim[4, 5])
    across = max(sim[i, j] for i in range(3) for j in range(3, 6))
    assert within > across


def test_lexical_subsets_take_one_passage_per_topic():
    order = [0, 3, 1, 4, 5, 2]  # the two topics interleaved, as a ranking would
    docs = [{"title": "", "text": (CATS + DATABASES)[i]} for i in order]
    topic = ["cat" if i < 3 else "db" for i in order]
    subsets, info = lexical_subsets()("What do cats do?", docs, 2, 5, 0)
    assert info["clusters"] == 2 and sorted(info["cluster_sizes"]) == [3, 3]
    assert info["clustering_vectors"] == "lexical" and len(subsets) == 5
    for s in subsets:
        assert sorted(topic[i] for i in s) == ["cat", "db"], s
    assert lexical_subsets()("What do cats do?", docs, 2, 5, 0) == (subsets, info)  # seeded


@pytest.mark.parametrize("texts, dim, message", [([], 8, "at least one text"), (["a cat"], 0, "width must be >= 1")])
def test_bad_input(texts, dim, message):
    with pytest.raises(SpecRagError, match=message):
        hashed_tfidf(texts, dim)
