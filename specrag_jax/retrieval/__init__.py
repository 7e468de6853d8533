"""Retrieval: corpora, BM25 and dense indexes, model embeddings, JAX k-means, document subsets."""

from specrag_jax.retrieval.corpus import (
    Document,
    default_corpus,
    doc_text,
    docs_from_context,
    load_corpus,
)
from specrag_jax.retrieval.dense import DenseIndex
from specrag_jax.retrieval.embedding import Embedder, hidden_states, l2_normalize
from specrag_jax.retrieval.kmeans import KMeansResult, kmeans
from specrag_jax.retrieval.lexical import LexicalIndex
from specrag_jax.retrieval.subsets import SubsetSample, cover_subsets, sample_subsets

__all__ = [
    "DenseIndex",
    "Document",
    "Embedder",
    "KMeansResult",
    "LexicalIndex",
    "SubsetSample",
    "default_corpus",
    "doc_text",
    "docs_from_context",
    "hidden_states",
    "kmeans",
    "l2_normalize",
    "load_corpus",
    "sample_subsets",
    "cover_subsets",
]
