"""Service: the loaded models, one engine per model, and the RAG pipeline running on those engines.

Each RAG request runs the unchanged pipeline (``SpecRAG``) in a worker thread over ``EngineTextModel``s,
so many requests interleave their drafting (drafter engine) and verification (verifier engine), and the
two engines step at the same time.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from specrag_jax.errors import SpecRagError
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.specrag import RAGAnswer, RAGConfig, SearchFn, SpecRAG, SubsetFn
from specrag_jax.serving.adapter import EngineTextModel, RequestContext
from specrag_jax.serving.engine import Engine, StageFn
from specrag_jax.serving.policy import SchedulerConfig


@dataclasses.dataclass
class ServeConfig:
    request_timeout: float = 120.0  # seconds per request (engine work included)
    max_inflight: int = 32  # requests being served at once; more wait in the admission queue
    max_waiting: int = 64  # requests waiting beyond that: refused with 429
    max_body_bytes: int = 1 << 20
    api_key: str | None = None
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    prefix_cache: bool = True
    rag: RAGConfig = dataclasses.field(default_factory=RAGConfig)


class Service:
    """Models + engines + RAG resources shared by all HTTP requests."""

    def __init__(self, drafter: TextModel, verifier: TextModel, *, subsets: SubsetFn | None = None,
                 search: SearchFn | None = None, config: ServeConfig | None = None,
                 on_stage: StageFn | None = None) -> None:
        self.config = config or ServeConfig()
        self.models = {"drafter": drafter, "verifier": verifier}
        self.engines: dict[str, Engine] = {}
        by_runner: dict[int, Engine] = {}
        for role, model in self.models.items():  # one engine per model (a model serving both roles: one engine)
            eng = by_runner.get(id(model.runner))
            if eng is None:
                eng = Engine(model.runner, model.generator.eos_ids, name=role, config=self.config.scheduler,
                             prefix_cache=self.config.prefix_cache, on_stage=on_stage)
                by_runner[id(model.runner)] = eng
            self.engines[role] = eng
        self.subsets, self.search = subsets, search
        self.pool = ThreadPoolExecutor(max_workers=self.config.max_inflight, thread_name_prefix="rag")
        self._lock = threading.Lock()
        self.waiting = 0
        self.inflight = 0

    @property
    def unique_engines(self) -> dict[str, Engine]:
        return {e.name: e for e in self.engines.values()}

    def warmup(self, level: str = "full", sampled: bool = True) -> dict:
        """Compile every engine's step shapes before ``start()`` (``serving.warmup``); a report per engine.
        Only the verifier's engine scores trees, so only it compiles the scoring shapes."""
        from specrag_jax.serving.warmup import check_map_budget, step_shapes, warmup

        scorer = self.engines["verifier"]
        shapes = {name: step_shapes(eng, level, sampled, score=eng is scorer)
                  for name, eng in self.unique_engines.items()}
        check_map_budget(sum(len(s) for s in shapes.values()))
        return {name: warmup(eng, shapes=shapes[name]).as_dict() for name, eng in self.unique_engines.items()}

    def start(self) -> "Service":
        for eng in self.unique_engines.values():
            eng.start()
        return self

    def stop(self, drain: bool = True, timeout: float | None = 30.0) -> None:
        for eng in self.unique_engines.values():
            eng.stop(drain=drain, timeout=timeout)
        self.pool.shutdown(wait=drain, cancel_futures=not drain)

    # ------------------------------------------------------------------ request slots
    def try_enter(self) -> bool:
        """Take a request slot (or a waiting place); False = too busy (HTTP 429)."""
        with self._lock:
            if self.inflight >= self.config.max_inflight + self.config.max_waiting:
                return False
            self.inflight += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.inflight -= 1

    # ------------------------------------------------------------------ work
    def model(self, name: str | None) -> tuple[str, TextModel]:
        """The role and model for an OpenAI ``model`` field (a role, a model name, or None = drafter)."""
        if name in (None, "", "default"):
            return "drafter", self.models["drafter"]
        for role, m in self.models.items():
            if name in (role, m.name):
                return role, m
        names = sorted({*self.models, *(m.name for m in self.models.values())})
        raise SpecRagError(f"unknown model {name!r}; choose one of {', '.join(names)}")

    def text_model(self, role: str, ctx: RequestContext) -> EngineTextModel:
        return EngineTextModel(self.models[role], self.engines[role], ctx, role)

    def rag(self, question: str, docs, method: str, ctx: RequestContext, *, m: int | None = None,
            k: int | None = None) -> RAGAnswer:
        """Run the pipeline for one question on the shared engines (blocks; call from a worker thread)."""
        if self.subsets is None:
            raise SpecRagError("this server has no subset sampler (RAG is not configured)")
        cfg = dataclasses.replace(self.config.rag, m=m or self.config.rag.m, k=k or self.config.rag.k)
        rag = SpecRAG(self.text_model("drafter", ctx), self.text_model("verifier", ctx), subsets=self.subsets,
                      search=self.search, config=cfg)
        return rag.answer(question, docs, method)

    def submit(self, fn: Callable, *args, **kwargs):
        return self.pool.submit(fn, *args, **kwargs)
