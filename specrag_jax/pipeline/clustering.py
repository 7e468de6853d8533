"""How a question's retrieved passages are grouped before drafting: the subset samplers ``SpecRAG`` calls.

Both group the passages with k-means (k clusters) and draw m unique subsets, one passage per cluster
(``retrieval.subsets``); they differ in the vectors clustered:

- ``drafter``: the drafter's question-conditioned embeddings (a forward pass over question + every passage;
  ``retrieval.embedding``), the paper's instruction-aware embeddings in kind;
- ``lexical``: hashed TF-IDF rows of the passages' words (``retrieval.lexical_vectors``): no model pass.

``RAGConfig.clustering`` names one; ``subset_sampler`` builds it. ``RAGConfig.subsets`` says how the subsets are
drawn from the clusters: ``sample`` (the paper's: m random subsets of one passage per cluster) or ``cover`` (m
subsets that together hold every retrieved passage, each mixing the clusters: ``retrieval.cover_subsets``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.text_model import TextModel
from specrag_jax.retrieval import Embedder, cover_subsets, doc_text, kmeans, sample_subsets
from specrag_jax.retrieval.lexical_vectors import hashed_tfidf

CLUSTERINGS = ("drafter", "lexical")
SUBSET_MODES = ("sample", "cover")

# (question, docs, k, m, seed) -> (subsets as document indices, trace info)
SubsetFn = Callable[[str, list[dict], int, int, int], tuple[list[list[int]], dict]]


def check_clustering(name: str) -> None:
    """One-line error for an unknown clustering option."""
    if name not in CLUSTERINGS:
        raise SpecRagError(f"unknown clustering {name!r}; choose one of {', '.join(CLUSTERINGS)}")


def check_subsets(mode: str) -> None:
    """One-line error for an unknown subset mode."""
    if mode not in SUBSET_MODES:
        raise SpecRagError(f"unknown subsets mode {mode!r}; choose one of {', '.join(SUBSET_MODES)}")


def subsets_from_points(
    points: np.ndarray, k: int, m: int, seed: int, info: dict, mode: str = "sample"
) -> tuple[list[list[int]], dict]:
    """k-means over ``points`` [docs, dim] -> m unique subsets (``mode`` sample: one document per cluster; cover:
    together every document) and the trace's info."""
    km = kmeans(points, k, seed=seed)
    sample = sample_subsets(km.labels, m, seed=seed) if mode == "sample" else cover_subsets(km.labels, m, km.k)
    info = {
        "clusters": int(km.k),
        "cluster_sizes": [int((km.labels == c).sum()) for c in range(km.k)],
        "subsets_mode": mode,
        **info,
    }
    notes = [n for n in (km.note, sample.note) if n]
    if notes:
        info["subset_notes"] = notes
    return [list(s) for s in sample.subsets], info


def clustered_subsets(embedder: Embedder, mode: str = "sample") -> SubsetFn:
    """Question-conditioned drafter embeddings -> k-means (k clusters) -> m unique subsets."""

    def subsets(question: str, docs: list[dict], k: int, m: int, seed: int) -> tuple[list[list[int]], dict]:
        points = embedder.embed_for_question(question, docs)
        counts = {f"clustering_{key}": v for key, v in embedder.last_call.items()}  # the roofline reads them
        return subsets_from_points(points, k, m, seed, counts, mode)

    return subsets


def lexical_subsets(mode: str = "sample") -> SubsetFn:
    """Hashed TF-IDF of the passages -> k-means (k clusters) -> m unique subsets (no model pass)."""

    def subsets(question: str, docs: list[dict], k: int, m: int, seed: int) -> tuple[list[list[int]], dict]:
        points = hashed_tfidf([doc_text(d) for d in docs])
        return subsets_from_points(points, k, m, seed, {"clustering_vectors": "lexical"}, mode)

    return subsets


def subset_sampler(clustering: str, drafter: TextModel, mode: str = "sample") -> SubsetFn:
    """The subset sampler ``clustering`` names ("drafter" embeds with ``drafter``), drawing subsets by ``mode``."""
    check_clustering(clustering)
    check_subsets(mode)
    return clustered_subsets(Embedder(drafter), mode) if clustering == "drafter" else lexical_subsets(mode)
