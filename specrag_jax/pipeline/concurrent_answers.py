"""Questions answered on started engines, the serving path in process: ``specrag eval --concurrency N`` and
``--progressive-prefill`` in ask and eval.

Each question runs the unchanged pipeline (``SpecRAG.answer_methods``) in a worker thread over ``Generator.over``
one shared started engine per model, so one engine step carries the drafts (or the prompts) of several questions,
and work submitted from another thread (progressive prefill while the reranker scores) runs beside the question's
own. With progressive prefill the engines keep a radix prefix cache (what was prefilled early is reused, not
recomputed), and a reranker on the drafter or the verifier is served by that model's engine
(``rerank.engine_reranker``: every candidate a scoring request, documents in the same cache), as ``specrag
serve`` does; a reranker on another model runs on its own model, one call at a time.

Per-question latencies then include waiting for the other questions' work; the throughput is what changes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence, TypeVar

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.per_model import distinct_engines, engine_per_model
from specrag_jax.models.generation import Generator, offline_config
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.reranking import OneAtATime
from specrag_jax.pipeline.specrag import SpecRAG
from specrag_jax.rerank.engine_reranker import EngineReranker

Row = TypeVar("Row")
Answer = TypeVar("Answer")


def on_started_engines(rag: SpecRAG, concurrency: int) -> bool:
    """Whether questions run on shared started engines: several at once, or with progressive prefill."""
    return concurrency > 1 or rag.config.progressive_prefill > 0


def reranker_model_role(rag: SpecRAG) -> str | None:
    """The role whose model ``rag.reranker`` scores with (None: no reranker, or one on another model)."""
    runner = getattr(getattr(rag.reranker, "model", None), "runner", None)
    for role in ("drafter", "verifier"):
        if runner is not None and getattr(rag, role).runner is runner:
            return role
    return None


def check_concurrency(rag: SpecRAG, concurrency: int) -> None:
    """One-line errors for a concurrency the pipeline cannot run (checked before any question)."""
    if concurrency < 1:
        raise SpecRagError(f"--concurrency must be >= 1 (got {concurrency})")
    if concurrency > 1 and rag.config.clustering == "drafter":
        raise SpecRagError(
            "--concurrency > 1 needs --clustering lexical: the drafter's embedder runs outside the engines"
        )
    role = reranker_model_role(rag)
    if on_started_engines(rag, concurrency) and role and rag.config.rerank != "kv":
        raise SpecRagError(engine_rerank_error(rag.config.rerank, role))


def engine_rerank_error(mode: str, role: str) -> str:
    """Why a reranker on a model with a started engine must be the engine-served kv mode."""
    return (
        f"--rerank {mode} on the {role} would run its model beside that model's started engine; with "
        "--concurrency > 1 or --progressive-prefill use --rerank kv (served by the engine) or another --reranker"
    )


class SharedEngines:
    """A started engine per model of ``rag`` (one for both roles when they share a model), stopped on exit.

    The engines keep a prefix cache (finished prompts' pages for later requests) with progressive prefill or an
    engine-served reranker; otherwise questions share nothing but the engines' steps."""

    def __init__(self, rag: SpecRAG) -> None:
        self.rag = rag
        self.reranker_role = reranker_model_role(rag)
        self.prefix_cache = rag.config.progressive_prefill > 0 or self.reranker_role is not None
        models = {"drafter": rag.drafter, "verifier": rag.verifier}
        self.engines = engine_per_model(models, self._engine)
        self._distinct = list(distinct_engines(self.engines).values())
        self._reranker: EngineReranker | OneAtATime | None = None
        if self.reranker_role is not None:
            role = self.reranker_role
            tokens = rag.config.max_doc_tokens
            store = getattr(rag.reranker, "store", None)  # the direct kv reranker's --kv-store, read by the engine's
            self._reranker = EngineReranker(getattr(rag, role), self.engines[role], max_doc_tokens=tokens, store=store)
        elif rag.reranker is not None:
            self._reranker = OneAtATime(rag.reranker)

    def _engine(self, role: str, model: TextModel) -> Engine:
        config = offline_config(model.runner)
        return Engine(model.runner, model.generator.eos_ids, name=role, config=config, prefix_cache=self.prefix_cache)

    def __enter__(self) -> "SharedEngines":
        for eng in self._distinct:
            eng.start()
        return self

    def __exit__(self, *exc) -> None:
        for eng in self._distinct:
            eng.stop(drain=False)
            eng.reset_prefix_cache()  # the cached prompts' pages go back to the model's pool

    def _model(self, role: str, ctx: RequestContext) -> TextModel:
        base: TextModel = getattr(self.rag, role)
        gen = Generator.over(self.engines[role], ctx, role, base.generator.speculation)
        return TextModel(base.name, base.runner, base.tokenizer, base.load_s, base.instruct, gen)

    def pipeline(self) -> SpecRAG:
        """A ``SpecRAG`` for one question (its own per-question state) over the shared engines."""
        ctx = RequestContext()
        rag = self.rag
        reranker = self._reranker.bind(ctx) if isinstance(self._reranker, EngineReranker) else self._reranker
        copy = SpecRAG(
            self._model("drafter", ctx),
            self._model("verifier", ctx),
            subsets=rag.subsets_fn,
            search=rag.search,
            config=rag.config,
            progress=rag.progress,
            reranker=reranker,
        )
        copy.drafter_adapter = rag.drafter_adapter
        return copy


def answer_rows(
    rag: SpecRAG, rows: Sequence[Row], answer: Callable[[SpecRAG, Row], Answer], concurrency: int = 1
) -> Iterator[Answer]:
    """``answer(pipeline, row)`` for every row, in order: on ``rag`` itself one at a time, or on ``concurrency``
    worker threads over shared started engines (also for one at a time with progressive prefill)."""
    check_concurrency(rag, concurrency)
    if not on_started_engines(rag, concurrency):
        for row in rows:
            yield answer(rag, row)
        return
    with SharedEngines(rag) as shared, ThreadPoolExecutor(concurrency, thread_name_prefix="answer") as pool:
        yield from pool.map(lambda row: answer(shared.pipeline(), row), rows)
