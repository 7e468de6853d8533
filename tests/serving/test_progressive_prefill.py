"""Progressive prefill on the engines (tiny models, a scripted fake reranker): reuse through the prefix cache,
identical greedy output when the top set changes, no leaked pages (cancel, error), one-line refusals."""

from __future__ import annotations

import time

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.serving.app import create_app
from specrag_jax.serving.service import ServeConfig, Service
from tests.serving.conftest import assert_pages_home
from tests.serving.rag_schema_check import assert_follows_rag_schema

QUESTION = "Which city is the capital of Italy?"
DOCS = [
    {"id": i, "title": i.title(), "text": f"{i.title()} is a city with a long history, number {n}."}
    for n, i in enumerate(["rome", "milan", "turin", "naples", "genoa"])
]


class Scripted:
    """Fake reranker: fixed scores per document id; ``hook(call)`` runs before each group is scored."""

    def __init__(self, scores: dict[str, float], hook=None) -> None:
        self.scores, self.hook, self.calls = scores, hook, 0

    def score(self, question, docs):
        self.calls += 1
        if self.hook is not None:
            self.hook(self.calls)
        return [self.scores[d["id"]] for d in docs]


STABLE = {"rome": 5.0, "milan": 4.0, "turin": 1.0, "naples": 0.5, "genoa": 0.2}  # top 2 fixed after group 2
CHANGED = {"rome": 5.0, "milan": 4.0, "turin": 1.0, "naples": 9.0}  # naples enters at group 4, the last


def rag_config(progressive: int, **kw) -> RAGConfig:
    return RAGConfig(
        **{
            "n_docs": 2,
            "m": 2,
            "k": 1,
            "max_draft_tokens": 8,
            "max_answer_tokens": 4,
            "max_doc_tokens": 40,
            "rerank": "recompute",
            "rerank_group": 1,
            "rerank_patience": 2,
            "progressive_prefill": progressive,
            **kw,
        }
    )


@pytest.fixture
def service(rag_models, rag_resources):
    holder: dict = {}
    svc = Service(
        *rag_models,
        subsets=rag_resources[0],
        search=rag_resources[1],
        config=ServeConfig(rag=rag_config(1)),
        reranker=lambda mode: holder["scorer"],
    )
    svc.start()
    svc.holder = holder
    yield svc
    svc.stop(drain=False)
    for eng in svc.unique_engines.values():
        eng.cache.clear()


def ask(svc: Service, scores: dict, progressive: int, method: str = "speculative", hook=None, ctx=None):
    docs = [d for d in DOCS if d["id"] in scores]
    """One cold-cache /v1/rag-style call; returns (answer, the drafter engine's drafting request)."""
    for eng in svc.unique_engines.values():
        eng.reset_prefix_cache()
    svc.holder["scorer"] = Scripted(scores, hook)
    svc._rerankers.clear()
    drafting: list = []
    eng = svc.engines["drafter"]
    submit = eng.submit_phases

    def spy(*a, **kw):
        drafting.append(submit(*a, **kw))
        return drafting[-1]

    eng.submit_phases = spy
    try:
        ans = svc.rag(QUESTION, docs, method, ctx or RequestContext(timeout=600), progressive_prefill=progressive)
    finally:
        del eng.submit_phases
    for e in svc.unique_engines.values():
        assert_pages_home(e)
    return ans, (drafting[0] if drafting else None)


def full_pages(req) -> int:
    """Prompt tokens of a drafting request a warm cache can serve: every full page but the one each branch ends in."""
    ps = 16
    return sum((len(req.prefix) + len(s) - 1) // ps * ps for s in req.suffixes)


def test_a_stable_top_set_is_reused_from_the_prefix_cache(service):
    base, req0 = ask(service, STABLE, 0)
    got, req1 = ask(service, STABLE, 1)
    assert req0.cached_tokens == 0  # cold cache, no progressive prefill: drafting prefills everything
    info = got.trace["progressive"]
    assert info["launches"] == 1 and info["launch_groups"] == [3] and info["final_was_prefilled"]
    assert got.trace["rerank"]["groups_scored"] == 4 and not info["notes"]
    assert req1.cached_tokens == full_pages(req1) > 0  # shared prefix and both branches: no page recomputed
    assert [d.text for d in got.drafts] == [d.text for d in base.drafts] and got.answer == base.answer
    assert got.trace["first_draft_token_s"] > 0 and "prefill_wait_s" in got.trace
    assert_follows_rag_schema(create_app(service).openapi(), got.to_dict())  # the rerank and progressive traces


def test_a_changed_top_set_falls_back_through_the_cache_with_the_same_output(service):
    base, _ = ask(service, CHANGED, 0)
    got, req = ask(service, CHANGED, 1)
    info = got.trace["progressive"]
    assert info["launches"] == 1 and not info["final_was_prefilled"]
    assert got.trace["documents"] == base.trace["documents"] == ["naples", "rome"]
    # the shared prefix and the unchanged branch ("rome") came from the cache; the new one ("naples") did not
    aligned = len(req.prefix) // 16 * 16
    assert aligned < req.cached_tokens < full_pages(req) and info["cancelled"] == 0
    assert [d.text for d in got.drafts] == [d.text for d in base.drafts] and got.answer == base.answer


def test_standard_method_prefills_the_verifier_prompt(service):
    base, _ = ask(service, STABLE, 0, method="standard")
    verifier = service.engines["verifier"]
    before = verifier.stats()["prefix_hit_tokens"]
    got, _ = ask(service, STABLE, 1, method="standard")
    assert verifier.stats()["prefix_hit_tokens"] - before >= got.trace["verifier_prefill_tokens"] - 16
    assert got.answer == base.answer


def test_cancel_and_errors_during_reranking_leak_no_pages(service):
    ctx = RequestContext(timeout=600)
    with pytest.raises(SpecRagError, match="cancelled"):
        ask(service, STABLE, 1, hook=lambda call: call == 4 and ctx.cancel(), ctx=ctx)

    def boom(call):
        if call == 4:
            raise RuntimeError("reranker broke")

    with pytest.raises(RuntimeError, match="reranker broke"):
        ask(service, STABLE, 1, hook=boom)

    def slow(call):  # the rerank fails while the prefill request is (likely) in the engine
        if call == 4:
            eng = service.engines["drafter"]
            for _ in range(200):
                if eng.stats()["running_requests"] or eng.stats()["queue_depth"]:
                    break
                time.sleep(0.005)
            raise RuntimeError("late failure")

    with pytest.raises(RuntimeError, match="late failure"):
        ask(service, STABLE, 1, hook=slow)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rerank="none"), "progressive prefill overlaps reranking: it needs rerank kv or recompute"),
        (dict(rerank_patience=1), "progressive_prefill (1 stable groups) must be below rerank_patience (1)"),
        (dict(progressive_prefill=-1), "progressive_prefill must be a whole number of stable groups >= 0"),
    ],
)
def test_bad_progressive_config_is_a_one_line_error(kwargs, message):
    with pytest.raises(SpecRagError) as err:
        rag_config(1, **kwargs).check()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_text_model_without_a_prefix_cache_refuses_progressive_prefill_when_it_answers(rag_models):
    rag = SpecRAG(*rag_models, subsets=lambda *a: ([], {}), config=rag_config(1), reranker=Scripted(STABLE))
    with pytest.raises(SpecRagError) as err:  # built (ask and eval answer on started engines: concurrent_answers)
        rag.answer(QUESTION, DOCS)
    assert "needs a prefix cache" in str(err.value) and "\n" not in str(err.value)


def test_the_trigger_sees_each_group_and_never_fires_on_the_last():
    from specrag_jax.rerank.coarse_to_fine import rerank_coarse_to_fine

    seen = []
    docs = [{"id": i} for i in ("rome", "milan", "turin", "naples", "genoa")]
    rerank_coarse_to_fine(
        "q",
        docs,
        lambda q, ds: [STABLE[d["id"]] for d in ds],
        2,
        group=1,
        patience=3,
        on_group=lambda top, stable, last: seen.append(([d["id"] for d in top], stable, last)),
    )
    assert [(s, last) for _, s, last in seen] == [(0, False), (0, False), (1, False), (2, False), (3, True)]
    assert seen[2][0] == ["rome", "milan"]


@pytest.mark.parametrize(
    "head, message",
    [
        (["ask", "What is Python?", "--rerank", "recompute", "-q"], "--rerank recompute on the drafter would run"),
        (
            ["eval", "--data", "tests/pipeline/data/mini_eval.jsonl", "--rerank", "recompute", "-q"],
            "use --rerank kv (served by the engine) or another --reranker",
        ),
        (
            ["serve", "--compile-cache", "none", "--drafter", "tiny:llama", "--verifier", "tiny:llama"],
            "progressive prefill overlaps reranking: it needs rerank kv or recompute",
        ),
    ],
)
def test_progressive_flag_errors_are_one_line(capsys, head, message):
    from specrag_jax.cli import main

    assert main(head + ["--progressive-prefill"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specrag: error: ") and message in err[0], err
