"""Reranking: a decoder reranker over stored document K/V, coarse-to-fine with early termination."""
