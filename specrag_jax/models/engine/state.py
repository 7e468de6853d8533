"""What an engine's step builders and its warm-up work on, without the engine: its state and the ways back.

``EngineState`` is one model's request bookkeeping -- the runner and its page pool, the prefix cache and
admission, backpressure, the queued and running requests, counters -- plus what a finished step does to it
(``prefix_ready``, ``record_tokens``, ``complete``, ``fail``, ...). ``Engine`` (``engine.py``) owns one and
runs the loop; ``steps.py`` and ``spec_steps.py`` build and dispatch steps on it, and ``warmup.py`` reads an
``EngineView``. None of them imports ``engine.py``. Everything here runs with ``lock`` held (the loop's lock).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Protocol, Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.admission import Admitter
from specrag_jax.models.engine.policy import Backpressure, DecodeWidth, SchedulerConfig
from specrag_jax.models.engine.prefix_cache import PrefixCache
from specrag_jax.models.engine.requests import EngineError, Request, RequestCancelled, RequestTimeout, Seq
from specrag_jax.models.engine.rules import GenerationResult, check_prompt
from specrag_jax.models.executor.runner import ModelRunner

StageFn = Callable[[str, str, float], None]  # (engine, stage, seconds)


class EngineView(Protocol):
    """What warm-up reads of an engine (``Engine`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def runner(self) -> ModelRunner: ...

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def counters(self) -> collections.Counter: ...

    @property
    def started(self) -> bool: ...


class EngineState:
    """One model's pages, requests and counters, and how a step's results reach the requests."""

    def __init__(
        self,
        runner: ModelRunner,
        eos_ids: Sequence[int] = (),
        *,
        name: str = "model",
        config: SchedulerConfig | None = None,
        prefix_cache: bool = True,
        on_stage: StageFn | None = None,
    ) -> None:
        self.runner, self.name = runner, name
        self.config = config or SchedulerConfig()
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.cache = PrefixCache(runner.allocator, runner.page_size, enabled=prefix_cache)
        runner.penalties.reserve(self.config.max_running)  # before warm-up: the slot count is a step shape
        self.admitter = Admitter(runner.allocator, self.cache, runner.page_size, runner.max_seq_len, runner.penalties)
        self.backpressure = Backpressure(self.config)
        self.widths = DecodeWidth(self.config)
        self.on_stage = on_stage  # told the seconds of every stage (queue wait, steps, request)
        self.lock = threading.Lock()  # held while the loop mutates pages / requests
        self.queue: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.counters: collections.Counter = collections.Counter()
        self.recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, tokens generated)

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Refuse a prompt the context cannot hold with ``max_new_tokens`` more (``rules.check_prompt``)."""
        check_prompt(self.runner, prompt, max_new_tokens)

    def stage(self, stage: str, seconds: float) -> None:
        if self.on_stage is not None:
            self.on_stage(self.name, stage, seconds)

    def prefix_ready(self, req: Request) -> None:
        """A group's shared prefix is in the pool: its branches may run; the prefix sequence lets go."""
        for s in req.seqs:
            s.ready = True
        self.admitter.release(Request("generate", [], seqs=[req.prefix_seq]))  # type: ignore[list-item]
        req.prefix_seq = None

    def record_tokens(self, n: int) -> None:
        self.recent.append((time.perf_counter(), n))
        self.counters["generated_tokens"] += n

    def finish(self, req: Request, error: BaseException | None = None, value=None) -> None:
        """End ``req`` with ``error`` or ``value``: its pages go back and it leaves the queue or the running set."""
        self.admitter.release(req)
        if req in self.running:
            self.running.remove(req)
            if not self.running:
                self.widths.idle()
        if req in self.queue:
            self.queue.remove(req)
        self.counters["failed" if error else "completed"] += 1
        if error is not None and isinstance(error, (RequestCancelled, RequestTimeout)):
            self.counters["cancelled" if isinstance(error, RequestCancelled) else "timed_out"] += 1
        if not req.future.done():
            if error is not None:
                req.future.set_exception(error)
            else:
                req.future.set_result(value)

    def fail_all(self, error: BaseException) -> None:
        """End every queued and running request: a loop iteration raised ``error``."""
        for req in list(self.queue) + list(self.running):
            self.finish(req, EngineError(f"engine error: {error}"))

    def fail(self, req: Request, error: BaseException) -> None:
        """End a request with an error (its pages return to the pool)."""
        self.finish(req, error if isinstance(error, SpecRagError) else EngineError(f"engine error: {error}"))

    def complete(self, req: Request) -> None:
        now = time.perf_counter()
        if req.kind == "score":
            return
        results = [self.result_of(s) for s in req.seqs]
        if req.phases:  # one list per phase: the earlier phases' results were kept as each branch moved on
            results = [[s.phase_results[p] for s in req.seqs] for p in range(len(req.phases) - 1)] + [results]
        self.stage("request", now - req.submitted_at)
        self.finish(req, value=results)

    @staticmethod
    def result_of(s: Seq) -> GenerationResult:
        """The result of a sequence's current (just finished) phase."""
        start = s.req.admitted_at if not s.phase_results else s.phase_started_at
        compiled = s.req.admitted_compile_s if not s.phase_results else s.phase_started_compile_s
        return GenerationResult(
            list(s.out),
            list(s.logprobs),
            s.finish or "length",
            len(s.prompt),
            s.prefill_done_at - start,
            s.finished_at - s.prefill_done_at,
            shared_prefix_tokens=s.req.shared_len,
            prefill_compile_s=max(s.prefill_done_compile_s - compiled, 0.0),
            decode_compile_s=max(s.finished_compile_s - s.prefill_done_compile_s, 0.0),
            speculation=s.spec_stats,
            top_logprobs=list(s.top_logprobs) if s.sampling.top_logprobs else None,
        )

    def complete_score(self, req: Request, logprobs: np.ndarray) -> None:
        self.stage("request", time.perf_counter() - req.submitted_at)
        self.finish(req, value=logprobs)
