"""Several questions at a time on one started engine per model: ``specrag eval --concurrency N``.

The serving path, in process: each question runs the unchanged pipeline (``SpecRAG.answer_methods``) in a worker
thread over ``Generator.over`` the shared engines, so one engine step carries the drafts (or the prompts) of
several questions. What one question cannot fill (five draft rows of a 135M drafter, one verifier prompt) is
nearly free to widen on a CPU whose decode steps are bound by weight reads.

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
from specrag_jax.pipeline.specrag import SpecRAG

Row = TypeVar("Row")
Answer = TypeVar("Answer")


def check_concurrency(rag: SpecRAG, concurrency: int) -> None:
    """One-line errors for a concurrency the pipeline cannot run (checked before any question)."""
    if concurrency < 1:
        raise SpecRagError(f"--concurrency must be >= 1 (got {concurrency})")
    if concurrency == 1:
        return
    if rag.reranker is not None:
        raise SpecRagError("--concurrency > 1 needs --rerank none: the reranker runs its model outside the engines")
    if rag.config.clustering == "drafter":
        raise SpecRagError(
            "--concurrency > 1 needs --clustering lexical: the drafter's embedder runs outside the engines"
        )


class SharedEngines:
    """A started engine per model of ``rag`` (one for both roles when they share a model), stopped on exit."""

    def __init__(self, rag: SpecRAG) -> None:
        self.rag = rag
        models = {"drafter": rag.drafter, "verifier": rag.verifier}
        self.engines = engine_per_model(models, self._engine)
        self._distinct = list(distinct_engines(self.engines).values())

    @staticmethod
    def _engine(role: str, model: TextModel) -> Engine:
        config = offline_config(model.runner)  # prefix cache off, as one question at a time runs
        return Engine(model.runner, model.generator.eos_ids, name=role, config=config, prefix_cache=False)

    def __enter__(self) -> "SharedEngines":
        for eng in self._distinct:
            eng.start()
        return self

    def __exit__(self, *exc) -> None:
        for eng in self._distinct:
            eng.stop(drain=False)

    def _model(self, role: str, ctx: RequestContext) -> TextModel:
        base: TextModel = getattr(self.rag, role)
        gen = Generator.over(self.engines[role], ctx, role, base.generator.speculation)
        return TextModel(base.name, base.runner, base.tokenizer, base.load_s, base.instruct, gen)

    def pipeline(self) -> SpecRAG:
        """A ``SpecRAG`` for one question (its own per-question state) over the shared engines."""
        ctx = RequestContext()
        rag = self.rag
        copy = SpecRAG(
            self._model("drafter", ctx),
            self._model("verifier", ctx),
            subsets=rag.subsets_fn,
            search=rag.search,
            config=rag.config,
            progress=rag.progress,
        )
        copy.drafter_adapter = rag.drafter_adapter
        return copy


def answer_rows(
    rag: SpecRAG, rows: Sequence[Row], answer: Callable[[SpecRAG, Row], Answer], concurrency: int = 1
) -> Iterator[Answer]:
    """``answer(pipeline, row)`` for every row, in order: on ``rag`` itself one at a time, or on ``concurrency``
    worker threads over shared started engines."""
    check_concurrency(rag, concurrency)
    if concurrency == 1:
        for row in rows:
            yield answer(rag, row)
        return
    with SharedEngines(rag) as shared, ThreadPoolExecutor(concurrency, thread_name_prefix="eval") as pool:
        yield from pool.map(lambda row: answer(shared.pipeline(), row), rows)
