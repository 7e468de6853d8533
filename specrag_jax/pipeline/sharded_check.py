"""End-to-end check of SpecRAG on disjoint device groups against one device (minutes of CPU; not run by the tests).

XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m specrag_jax.pipeline.sharded_check
"""

from __future__ import annotations

import json
import sys
import time

from specrag_jax.models.text_model import TextModel
from specrag_jax.parallel.submesh import drafter_verifier_placements
from specrag_jax.pipeline.clustering import clustered_subsets
from specrag_jax.pipeline.factory import DEFAULT_DRAFTER, DEFAULT_VERIFIER, lexical_search
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.retrieval import Embedder, LexicalIndex, default_corpus


def check_rag(question: str = "How do I leave a loop early in Python?") -> dict:
    """End to end: SpecRAG (default drafter on 2 devices, default verifier on 6 as data=3,model=2) vs one device.

    Not run by the tests (minutes of CPU); drafts, answer and draft scores should agree."""
    config = RAGConfig(m=3, k=2, n_docs=6, consensus=False)
    index = LexicalIndex.build(default_corpus())
    out = {}
    for name, pl in (("single", None), ("sharded", drafter_verifier_placements(2, 6, verifier_spec="data=3,model=2"))):
        t0 = time.perf_counter()
        d = TextModel.load(DEFAULT_DRAFTER, max_seq_len=1024, max_batch=3, placement=pl and pl.drafter)
        v = TextModel.load(DEFAULT_VERIFIER, max_seq_len=1024, max_batch=2, placement=pl and pl.verifier)
        rag = SpecRAG(d, v, subsets=clustered_subsets(Embedder(d)), search=lexical_search(index), config=config)
        r = rag.answer(question)
        out[name] = {
            "answer": r.answer,
            "drafts": [x.answer for x in r.drafts],
            "scores": [float(x.score) for x in r.drafts],
            "s": round(time.perf_counter() - t0, 1),
        }
    out["same_answer"] = out["single"]["answer"] == out["sharded"]["answer"]
    out["same_drafts"] = out["single"]["drafts"] == out["sharded"]["drafts"]
    out["max_score_diff"] = max(abs(a - b) for a, b in zip(out["single"]["scores"], out["sharded"]["scores"]))
    return out


if __name__ == "__main__":
    json.dump(check_rag(*sys.argv[1:2]), sys.stdout, indent=1)
    print()
