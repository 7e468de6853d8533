"""Real models (both families): scores from stored document K/V equal recomputed scores within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.reranker import Reranker

DOCS = [
    {
        "title": "Printing press",
        "text": "Gutenberg's press, built around 1440 in Mainz, combined movable metal type "
        "with an oil-based ink and a screw press.",
    },
    {"title": "Sleep", "text": "Bright light in the evening delays the release of melatonin and makes sleep later."},
    {"title": "Rivers", "text": "Near the sea a river slows down and drops its sediment, sometimes forming a delta."},
    {"title": "Mainz", "text": "Mainz is a city on the Rhine, the capital of Rhineland-Palatinate."},
]
QUESTION = "Who built the first printing press with movable metal type in Europe?"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_stored_kv_matches_recompute_on_real_model(name, tmp_path):
    from specrag_jax.models.text_model import TextModel

    model = TextModel.load(name, num_pages=128, max_seq_len=512)
    want = Reranker(model, mode="recompute").score(QUESTION, DOCS)
    store = DocKVStore(tmp_path, model)
    with Reranker(model, store=store) as r:
        computed = r.score(QUESTION, DOCS)
    with Reranker(model, store=store) as r:
        loaded = r.score(QUESTION, DOCS)
        assert r.stats.loaded == len(DOCS) and r.stats.computed == 0
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(computed, want, atol=1e-4)
    np.testing.assert_allclose(loaded, want, atol=1e-4)
    assert model.runner.allocator.num_free == model.runner.allocator.num_usable
