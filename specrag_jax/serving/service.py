"""Service: the loaded models, one engine per model, and the RAG pipeline running on those engines.

Each RAG request runs the unchanged pipeline (``SpecRAG``) in a worker thread over ``EngineTextModel``s,
so many requests interleave their drafting (drafter engine) and verification (verifier engine), and the
two engines step at the same time. A reranker (``--rerank``) on the drafter or the verifier runs in kv mode
as scoring requests on that model's engine (``rerank.engine_reranker``; documents reused from the radix
prefix cache); recompute mode and other models run on their own model instance, one call at a time
(``Service.reranker``).
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.per_model import distinct_engines, engine_per_model
from specrag_jax.models.engine.policy import SchedulerConfig
from specrag_jax.models.engine.state import StageFn
from specrag_jax.models.engine.warmup import check_map_budget, step_shapes, warmup
from specrag_jax.models.speculative.decode import Speculation, check_can_speculate
from specrag_jax.models.speculative.ngram_proposer import NgramProposer
from specrag_jax.models.speculative.tree import check_budget, default_tree_budget
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.clustering import SubsetFn
from specrag_jax.pipeline.reranking import OneAtATime, Scorer
from specrag_jax.pipeline.specrag import RAGAnswer, RAGConfig, SearchFn, SpecRAG
from specrag_jax.rerank.engine_reranker import EngineReranker
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.serving.adapter import EngineTextModel

SPECULATIVE = ("none", "ngram")  # proposers of /v1/completions and /v1/chat/completions (no drafts)
RAG_OPTIONS = (
    "m",
    "k",
    "rerank",
    "reranker",
    "n_coarse",
    "rerank_group",
    "rerank_patience",
    "progressive_prefill",
    "selection",
    "tau_min",
)  # per request
RerankerFactory = Callable[[str], Scorer]  # a rerank mode ("kv" | "recompute") -> a reranker


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
    speculative: str = "none"  # completions / chat completions speculate with this proposer: none | ngram
    # their largest token tree per step (8, 16, 32 or 64): 8 on CPU, 16 on a GPU or TPU
    spec_budget: int = dataclasses.field(default_factory=default_tree_budget)

    def __post_init__(self) -> None:
        if self.speculative not in SPECULATIVE:
            raise SpecRagError(
                f"unknown proposer {self.speculative!r} for --speculative (choose one of "
                f"{', '.join(SPECULATIVE)}; draft proposals serve /v1/rag's lossless method)"
            )
        check_budget(self.spec_budget)


class Service:
    """Models + engines + RAG resources shared by all HTTP requests."""

    def __init__(
        self,
        drafter: TextModel,
        verifier: TextModel,
        *,
        subsets: SubsetFn | None = None,
        search: SearchFn | None = None,
        config: ServeConfig | None = None,
        on_stage: StageFn | None = None,
        reranker: RerankerFactory | None = None,
        reranker_names: Sequence[str] = (),
        engine_reranker: bool = True,
        reranker_store: DocKVStore | None = None,
    ) -> None:
        """``reranker(mode)`` builds the reranker of a mode (once per mode); ``reranker_names``: the names a
        request's ``reranker`` field may give for it (default: the configured name, or the drafter's).
        ``engine_reranker``: when the reranker is the drafter or the verifier, ``kv`` mode is served by that
        model's engine (``rerank.engine_reranker``: documents stay in its radix prefix cache) instead of
        ``reranker(mode)``; ``reranker_store``: the document K/V store it reads documents from (``--kv-store``)."""
        self.config = config or ServeConfig()
        self.models = {"drafter": drafter, "verifier": verifier}
        self.engines = engine_per_model(self.models, self._engine(on_stage))
        if self.config.speculative != "none":
            for model in {id(m.runner): m for m in self.models.values()}.values():
                check_can_speculate(model.runner, self.speculation(), model.name)
        self.subsets, self.search = subsets, search
        self.pool = ThreadPoolExecutor(max_workers=self.config.max_inflight, thread_name_prefix="rag")
        self._lock = threading.Lock()
        self.reranker_factory, self._rerankers, self._rerank_lock = reranker, {}, threading.Lock()
        self.reranker_names = set(reranker_names) or {self.config.rag.reranker or "drafter"}
        self.reranker_role: str | None = None  # the served model that reranks (kv mode on its engine)
        for role, model in self.models.items():  # a role and its model's name are the same reranker
            if self.reranker_names & {role, model.name}:
                self.reranker_names |= {role, model.name}
                self.reranker_role = self.reranker_role or (role if engine_reranker else None)
        self._engine_rerankers: dict[int, EngineReranker] = {}
        self.reranker_store = reranker_store
        self.waiting = 0
        self.inflight = 0

    @property
    def unique_engines(self) -> dict[str, Engine]:
        return distinct_engines(self.engines)

    def _engine(self, on_stage: StageFn | None) -> Callable[[str, TextModel], Engine]:
        """Builds a model's engine with the served scheduler and prefix cache."""

        def make(role: str, model: TextModel) -> Engine:
            config, cache = self.config.scheduler, self.config.prefix_cache
            return Engine(
                model.runner, model.generator.eos_ids, name=role, config=config, prefix_cache=cache, on_stage=on_stage
            )

        return make

    def speculation(self) -> Speculation | None:
        """The token-tree speculation of completion requests (``--speculative``), or None."""
        if self.config.speculative == "none":
            return None
        return Speculation(NgramProposer(), self.config.spec_budget)

    def warmup(self, level: str = "full", sampled: bool = True) -> dict:
        """Compile every engine's step shapes before ``start()`` (``serving.warmup``); a report per engine.
        The verifier's engine scores trees, and so does the reranker's for kv reranking: they compile the
        scoring shapes. With ``--speculative`` every engine compiles the speculation steps up to
        ``spec_budget`` (the verifier's: up to the lossless mode's ``tree_budget`` too)."""
        scorers = {id(self.engines["verifier"])}
        if self.reranker_role is not None and self.reranker_factory is not None:  # kv reranking scores trees too
            scorers.add(id(self.engines[self.reranker_role]))
        scorer = self.engines["verifier"]
        spec = None if self.config.speculative == "none" else self.config.spec_budget
        lossless = None if spec is None else max(spec, self.config.rag.tree_budget)  # /v1/rag lossless trees too
        shapes = {
            name: step_shapes(
                eng, level, sampled, score=id(eng) in scorers, spec_budget=lossless if eng is scorer else spec
            )
            for name, eng in self.unique_engines.items()
        }
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

    def reranker(self, mode: str, ctx: RequestContext | None = None, max_doc_tokens: int | None = None) -> Scorer:
        """The server's reranker in ``mode``: ``kv`` on a served model's engine (``reranker_role``; with
        ``ctx``'s deadline and cancellation), else ``reranker(mode)`` built on first use, calls serialised."""
        if mode == "kv" and self.reranker_role is not None and self.reranker_factory is not None:
            tokens = self.config.rag.max_doc_tokens if max_doc_tokens is None else max_doc_tokens
            base = self._engine_rerankers.get(tokens)
            if base is None:
                role = self.reranker_role
                served = EngineReranker(
                    self.models[role], self.engines[role], max_doc_tokens=tokens, store=self.reranker_store
                )
                base = self._engine_rerankers.setdefault(tokens, served)
            return base if ctx is None else base.bind(ctx)
        if self.reranker_factory is None:
            raise SpecRagError("this server has no reranker (start it with --rerank kv or --rerank recompute)")
        with self._rerank_lock:
            if mode not in self._rerankers:
                self._rerankers[mode] = OneAtATime(self.reranker_factory(mode))
            return self._rerankers[mode]

    def rag(self, question: str, docs, method: str, ctx: RequestContext, **options: Any) -> RAGAnswer:
        """Run the pipeline for one question on the shared engines (blocks; call from a worker thread).

        ``options``: RAGConfig fields of ``RAG_OPTIONS`` overriding the server's (None: keep the server's)."""
        if self.subsets is None:
            raise SpecRagError("this server has no subset sampler (RAG is not configured)")
        options = {n: v for n, v in options.items() if v is not None}
        unknown = sorted(set(options) - set(RAG_OPTIONS))
        if unknown:
            raise SpecRagError(f"unknown RAG option {unknown[0]!r}; choose from {', '.join(RAG_OPTIONS)}")
        name = options.pop("reranker", None)
        if name is not None and name not in self.reranker_names:
            own = self.config.rag.reranker or self.models["drafter"].name
            raise SpecRagError(f"this server reranks with {own!r}, not {name!r} (start it with --reranker {name})")
        cfg = dataclasses.replace(self.config.rag, **options)
        cfg.check()
        scorer = None if cfg.rerank == "none" else self.reranker(cfg.rerank, ctx, cfg.max_doc_tokens)
        rag = SpecRAG(
            self.text_model("drafter", ctx),
            self.text_model("verifier", ctx),
            subsets=self.subsets,
            search=self.search,
            config=cfg,
            reranker=scorer,
        )
        return rag.answer(question, docs, method)

    def submit(self, fn: Callable, *args, **kwargs):
        return self.pool.submit(fn, *args, **kwargs)
