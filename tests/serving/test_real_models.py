"""The engine and /v1/rag on the real small models (slow): batch invariance, prefix cache, pages."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.rag_config import DEFAULT_SELECTION
from specrag_jax.pipeline.specrag import RAGConfig
from specrag_jax.serving.app import create_app
from specrag_jax.serving.service import ServeConfig, Service
from tests.serving.conftest import DOCS, assert_pages_home

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    return TextModel.load("smollm2-135m-instruct", max_seq_len=512, num_pages=160, page_size=16)


def test_real_model_greedy_batch_invariance_and_prefix_cache(smol):
    prompts = [smol.encode_prompt(f"Name a famous landmark in city number {i}.", chat=True) for i in range(8)]
    eng = Engine(smol.runner, smol.generator.eos_ids, name="smol").start()
    try:
        alone = [eng.submit_generate([], [p], SamplingParams(), 5).result(300)[0].token_ids for p in prompts]
        reqs = [eng.submit_generate([], [p], SamplingParams(), 5) for p in prompts]
        assert [r.result(300)[0].token_ids for r in reqs] == alone
        st = eng.stats()
        assert st["prefix_hit_tokens"] > 0  # the chat template's system prompt is shared
        assert_pages_home(eng)
    finally:
        eng.stop(drain=False)
        eng.cache.clear()


def test_real_models_rag_endpoint(smol):
    gemma = TextModel.load("gemma3-270m", max_seq_len=512, num_pages=96, page_size=16)
    subsets = lambda q, docs, k, m, seed: ([[i % len(docs), (i + 1) % len(docs)] for i in range(m)], {})  # noqa
    svc = Service(
        smol,
        gemma,
        subsets=subsets,
        config=ServeConfig(rag=RAGConfig(m=2, k=2, max_draft_tokens=12, max_answer_tokens=6, consensus=False)),
    )
    with TestClient(create_app(svc)) as c:
        r = c.post("/v1/rag", json={"question": "What is the capital of France?", "documents": DOCS[:3]})
        assert r.status_code == 200, r.text  # the default method: the router decides
        assert r.json()["method"] == "auto" and r.json()["trace"]["route"]["path"] in ("exact", "cascade")
        cascade = {"question": "What is the capital of France?", "documents": DOCS[:3], "method": "speculative"}
        r = c.post("/v1/rag", json=cascade)
        assert r.status_code == 200, r.text
        assert r.json()["trace"]["selection"] == DEFAULT_SELECTION
        r = c.post(
            "/v1/rag",
            json={**cascade, "selection": "evidence"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["drafts"]) == 2 and body["trace"]["evidence_tree_tokens"] > 0
        assert set(body["citations"]) <= {d["id"] for d in DOCS}
        r = c.post(
            "/v1/rag",
            json={**cascade, "selection": "rho", "tau_min": 0},
        )
        assert r.status_code == 200 and r.json()["trace"]["verifier_tree_tokens"] > 0, r.text
        assert r.json()["trace"]["path"] == "verified_draft"
    for eng in svc.unique_engines.values():
        assert_pages_home(eng)
        eng.cache.clear()
