"""Method ``auto`` in the pipeline (real SmolLM2 as drafter and verifier): the exact path gives standard RAG's answer
token for token without drafting, the cascade path gives the speculative method's answer, both record the route;
no page is left behind."""

from __future__ import annotations

import dataclasses

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.deferred_model import DeferredTextModel
from specrag_jax.pipeline import specrag as specrag_module
from specrag_jax.pipeline.specrag import METHODS, RAGConfig

SMOL = "smollm2-135m-instruct"
DOCS = [
    {"id": "a", "title": "Paris", "text": "Paris is the capital and largest city of France. It lies on the Seine."},
    {"id": "b", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine."},
    {"id": "c", "title": "Berlin", "text": "Berlin is the capital of Germany."},
]
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def rag():
    from specrag_jax.pipeline.factory import build_specrag

    return build_specrag(SMOL, SMOL, None, RAGConfig(m=2, max_answer_tokens=16), max_seq_len=1024)


def _forced(path: str):
    """``router.decide`` with its decision replaced by ``path`` (the rest as computed)."""
    real = specrag_module.decide

    def decide(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), path=path, reason=f"forced {path} (test)")

    return decide


def _pages_home(rag) -> None:
    for model in (rag.drafter, rag.verifier):
        if getattr(model, "loaded", True):  # a deferred drafter never loaded holds no pages
            assert model.runner.allocator.num_free == model.runner.allocator.num_usable


@pytest.mark.slow
def test_the_exact_path_is_standard_rag_token_for_token_without_drafting(rag, monkeypatch):
    """First in this file: the module's drafter is deferred and the exact path must not load it."""
    monkeypatch.setattr(specrag_module, "decide", _forced("exact"))
    assert isinstance(rag.drafter, DeferredTextModel) and not rag.drafter.loaded
    out = rag.answer_methods(QUESTION, DOCS, ["standard", "auto"])
    auto, standard = out["auto"], out["standard"]
    assert not rag.drafter.loaded  # no drafter weights were needed
    # auto's time is its own: retrieval, the decision and its answer, not standard's answer run before it
    own = auto.trace["retrieval_s"] + auto.trace["route"]["decide_s"] + auto.trace["generation_s"]
    assert auto.trace["total_s"] == pytest.approx(own, abs=0.05)
    assert auto.method == "auto" and auto.trace["path"] == "exact" and auto.trace["route"]["path"] == "exact"
    assert auto.answer == standard.answer
    assert auto.trace["verifier_decode_tokens"] == standard.trace["verifier_decode_tokens"]
    assert auto.trace["speculation"]["steps"] >= 1 and not auto.drafts and "drafting_s" not in auto.trace
    route = auto.trace["route"]
    assert route["predicted_s"]["exact"] > 0
    assert route["measured_s"] == pytest.approx(auto.trace["generation_s"] - auto.trace["compile_s"], abs=0.05)
    assert set(route["acceptance"]) == {"accept", "accept_right", "accept_standard_right"}
    _pages_home(rag)


@pytest.mark.slow
def test_the_cascade_path_is_the_speculative_answer(rag, monkeypatch):
    monkeypatch.setattr(specrag_module, "decide", _forced("cascade"))
    out = rag.answer_methods(QUESTION, DOCS, ["speculative", "auto"])
    auto, spec = out["auto"], out["speculative"]
    assert auto.method == "auto" and auto.trace["route"]["path"] == "cascade"
    assert auto.answer == spec.answer and auto.trace["path"] == spec.trace["path"]
    assert [d.text for d in auto.drafts] == [d.text for d in spec.drafts]
    _pages_home(rag)


@pytest.mark.slow
def test_auto_is_the_default_and_routes_on_its_own(rag):
    assert METHODS[0] == "auto"
    res = rag.answer(QUESTION, DOCS)
    assert res.method == "auto" and res.trace["route"]["path"] in ("exact", "cascade")
    assert res.trace["route"]["platform"] == "cpu" and res.trace["route"]["peaks"]["source"] == "measured"
    _pages_home(rag)


@pytest.mark.slow
def test_an_unknown_method_is_a_one_line_error(rag):
    with pytest.raises(SpecRagError) as err:
        rag.answer(QUESTION, DOCS, "router")
    assert "unknown method 'router'" in str(err.value) and "auto" in str(err.value) and "\n" not in str(err.value)
