"""Hashed TF-IDF vectors of a handful of texts: content vectors for clustering retrieved passages at no model cost.

Why. Clustering only has to group the retrieved passages by what they say, so that each draft's subset takes
one passage from every group (``retrieval.subsets``). The drafter's question-conditioned embeddings
(``Embedder.embed_for_question``) do this with a forward pass over every passage: 1.6 s of a 10-passage
question and 4.5-14.5 s of a 40-passage one on this CPU (``benchmarks/results/long_context.json``), about a
quarter of plain speculative RAG's time at 40 passages. Word statistics cost microseconds.

How. Terms are the lexical index's own (``lexical.tokenize``: lower-cased, stop words removed, stemmed).
Each term is hashed (CRC-32, stable across processes, unlike ``hash``) into one of ``dim`` buckets with a
sign from another bit of the hash, so collisions cancel in expectation. Weights are sublinear term
frequency (1 + log tf) times smoothed inverse document frequency over the given texts
(log((1 + n) / (1 + df)) + 1), and every row is L2-normalised: cosine geometry, as for embeddings. The width is
fixed, so k-means (padded to a power-of-two point count) compiles once per point bucket, never per question.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval.lexical import tokenize

DEFAULT_DIM = 2048


def term_bucket(term: str, dim: int) -> tuple[int, float]:
    """(bucket, sign) of ``term``: CRC-32's low bits pick the bucket, its top bit the sign."""
    h = zlib.crc32(term.encode("utf-8"))
    return h % dim, (1.0 if h >> 31 == 0 else -1.0)


def hashed_tfidf(texts: Sequence[str], dim: int = DEFAULT_DIM) -> np.ndarray:
    """[len(texts), dim] float32 L2-normalised TF-IDF rows (a text with no indexable term gets a zero row)."""
    if dim < 1:
        raise SpecRagError(f"hashed TF-IDF width must be >= 1 (got {dim})")
    if len(texts) == 0:
        raise SpecRagError("hashed TF-IDF needs at least one text")
    counts = [Counter(terms) for terms in tokenize(texts)]
    df = Counter(term for c in counts for term in c)
    n = len(texts)
    weight = {term: (*term_bucket(term, dim), np.log((1.0 + n) / (1.0 + d)) + 1.0) for term, d in df.items()}
    out = np.zeros((n, dim), np.float32)
    for row, c in enumerate(counts):
        for term, tf in c.items():
            b, sign, idf = weight[term]  # each term hashed and weighed once, not once per text
            out[row, b] += sign * (1.0 + np.log(tf)) * idf
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms > 0, norms, 1.0)
