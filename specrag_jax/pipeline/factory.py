"""Assembling a SpecRAG: models, corpus search and the multi-perspective subset sampler."""

from __future__ import annotations

from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.specrag import RAGConfig, SearchFn, SpecRAG, SubsetFn
from specrag_jax.retrieval import Embedder, LexicalIndex, default_corpus, kmeans, load_corpus, sample_subsets

DEFAULT_DRAFTER = "smollm2-135m-instruct"
DEFAULT_VERIFIER = "qwen2.5-coder-1.5b-instruct"


def clustered_subsets(embedder: Embedder) -> SubsetFn:
    """Question-conditioned embeddings -> k-means (k clusters) -> m unique subsets, one document per cluster."""

    def subsets(question: str, docs: list[dict], k: int, m: int, seed: int) -> tuple[list[list[int]], dict]:
        points = embedder.embed_for_question(question, docs)
        km = kmeans(points, k, seed=seed)
        sample = sample_subsets(km.labels, m, seed=seed)
        info = {"clusters": int(km.k), "cluster_sizes": [int((km.labels == c).sum()) for c in range(km.k)]}
        notes = [n for n in (km.note, sample.note) if n]
        if notes:
            info["subset_notes"] = notes
        return [list(s) for s in sample.subsets], info

    return subsets


def lexical_search(index: LexicalIndex) -> SearchFn:
    """Top-n documents of a BM25 index (as document dicts with their score)."""

    def search(question: str, n: int) -> list[dict]:
        return [{**index.docs[i], "score": float(s)} for i, s in index.search(question, n)]

    return search


def build_specrag(
    drafter: str = DEFAULT_DRAFTER,
    verifier: str = DEFAULT_VERIFIER,
    corpus: str | None = None,
    config: RAGConfig | None = None,
    max_seq_len: int = 2048,
    drafter_placement=None,
    verifier_placement=None,
) -> SpecRAG:
    """Load both models and a BM25 index over ``corpus`` (the built-in default corpus when None).

    ``*_placement``: optional ``specrag_jax.parallel.Placement`` per model (a device mesh; disjoint meshes let
    drafting and verification run on separate devices)."""
    config = config or RAGConfig()
    config.check()
    drafter_model = TextModel.load(drafter, max_seq_len=max_seq_len, max_batch=max(config.m, 1),
                                   placement=drafter_placement)
    verifier_model = TextModel.load(verifier, max_seq_len=max_seq_len, max_batch=2, placement=verifier_placement)
    docs = default_corpus() if corpus is None else load_corpus(corpus)
    index = LexicalIndex.build(docs)
    return SpecRAG(drafter_model, verifier_model, subsets=clustered_subsets(Embedder(drafter_model)),
                   search=lexical_search(index), config=config)
