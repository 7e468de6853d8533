"""Engine: one model's continuous-batching step loop over its fixed page pool.

A background thread repeatedly (1) drops cancelled and timed-out requests, (2) admits queued requests whose
pages fit (``admission.py``), (3) gathers the ready work of every running request -- decode tokens, prefill
chunks, verification trees -- into one ragged batch under the token budget, (4) runs ONE jitted step on the
model's ``ModelRunner`` (``pack`` pads to buckets) and (5) hands results back through futures. Sampling,
speculation (token trees, ``spec_steps.py``) and scoring steps take turns when several kinds of work wait
(the runner has one program per kind).
Callers on other threads only enqueue, cancel and read counters.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.generation import BetweenFn, GenerationResult, Generator, Phase
from specrag_jax.models.runner import ModelRunner
from specrag_jax.models.sampling import SamplingParams
from specrag_jax.models.speculative import Speculation, SpeculationStats, check_can_speculate
from specrag_jax.serving.admission import Admitter, worst_case_pages
from specrag_jax.serving.policy import Backpressure, SchedulerConfig
from specrag_jax.serving.prefix_cache import PrefixCache
from specrag_jax.serving.requests import (
    EngineError, EngineStopped, QueueFull, Request, RequestCancelled, RequestTimeout, StopFn, TokenFn, Tree,
)
from specrag_jax.serving.steps import StepBuilder

StageFn = Callable[[str, str, float], None]  # (engine, stage, seconds)


class Engine:
    """Continuous batching for one model. Start with ``start()``; ``stop(drain=True)`` finishes in-flight work."""

    def __init__(self, runner: ModelRunner, eos_ids: Sequence[int] = (), *, name: str = "model",
                 config: SchedulerConfig | None = None, prefix_cache: bool = True,
                 on_stage: StageFn | None = None) -> None:
        self.runner, self.name = runner, name
        self.config = config or SchedulerConfig()
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.cache = PrefixCache(runner.allocator, runner.page_size, enabled=prefix_cache)
        runner.penalties.reserve(self.config.max_running)  # before warm-up: the slot count is a step shape
        self.admitter = Admitter(runner.allocator, self.cache, runner.page_size, runner.max_seq_len,
                                 runner.penalties)
        self.backpressure = Backpressure(self.config)
        self._checker = Generator(runner, eos_ids)
        self._on_stage = on_stage
        self._cv = threading.Condition()
        self._state = threading.Lock()  # held while the loop mutates pages / requests
        self._queue: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []
        self._steps = StepBuilder(self)
        self._thread: threading.Thread | None = None
        self._accepting = False
        self._stop = False
        self.counters = collections.Counter()
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, tokens generated)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Engine":
        if self._thread is None:
            self._accepting, self._stop = True, False
            self._thread = threading.Thread(target=self._loop, name=f"engine-{self.name}", daemon=True)
            self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread is not None

    def warmup(self, level: str = "full", sampled: bool = True, score: bool = True,
               spec_budget: int | None = None):
        """Compile the step shapes this engine can reach (``serving.warmup``; ``spec_budget``: also speculation
        steps with trees up to that budget); before ``start()``."""
        from specrag_jax.serving.warmup import warmup

        return warmup(self, level, sampled, score, spec_budget=spec_budget)

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Refuse new work; with ``drain`` finish what is queued and running, else cancel it; join the loop."""
        with self._cv:
            self._accepting = False
            if not drain:
                for r in list(self._queue) + self._running:
                    r.cancelled = True
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # ------------------------------------------------------------------ submission
    def submit_generate(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]],
                        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
                        max_new_tokens: int = 64, stop_fn: StopFn | None = None, on_token: TokenFn | None = None,
                        timeout: float | None = None, speculation: Speculation | None = None) -> Request:
        """Queue a continuation of ``prefix + suffix`` for every suffix (shared prefix pages, one group).

        ``speculation``: decode with token trees (as ``Generator``'s; greedy output is the same)."""
        if max_new_tokens < 1:
            raise SpecRagError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
        return self._enqueue(self._generate_request(prefix, suffixes, sampling, max_new_tokens, stop_fn, on_token,
                                                    speculation), timeout)

    def _generate_request(self, prefix, suffixes, sampling, max_new_tokens: int, stop_fn, on_token,
                          speculation: Speculation | None = None) -> Request:
        if speculation is not None:
            if not isinstance(speculation, Speculation):
                raise SpecRagError(f"speculation must be a Speculation (got {type(speculation).__name__})")
            check_can_speculate(self.runner, speculation, f"engine {self.name}")
        if not suffixes:
            raise SpecRagError("no prompts given")
        params = [sampling] * len(suffixes) if isinstance(sampling, SamplingParams) else list(sampling)
        if len(params) != len(suffixes):
            raise SpecRagError(f"{len(params)} sampling settings for {len(suffixes)} prompts")
        if sum(p.penalized for p in params) > self.runner.penalties.capacity:
            raise SpecRagError(f"{sum(p.penalized for p in params)} penalised prompts in one request; the engine "
                               f"holds {self.runner.penalties.capacity} at once")
        prefix = [int(t) for t in prefix]
        suffixes = [[int(t) for t in s] for s in suffixes]
        for s in suffixes:
            self._checker.check_prompt(prefix + s, max_new_tokens)
        return Request("generate", prefix, suffixes, params, max_new_tokens, stop_fn, on_token,
                       speculation=speculation)

    def submit_phases(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]], phases: Sequence[Phase],
                      between: BetweenFn | None = None,
                      sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
                      max_forced_tokens: int = 32, timeout: float | None = None,
                      speculation: Speculation | None = None) -> Request:
        """Queue ``Generator.generate_phases`` work: each branch keeps its K/V from one phase to the next.

        When a branch ends a phase, ``between(phase, branch, result)`` (called on the engine thread) gives how
        many of its tokens to keep and the tokens to force; the branch then prefills only those and goes on,
        without waiting for the other branches. Pages for all phases plus ``max_forced_tokens`` forced tokens
        are reserved at admission. The future resolves to one list of results per phase. ``speculation`` as in
        ``submit_generate`` (every phase speculates)."""
        if not phases or any(ph.max_new_tokens < 1 for ph in phases):
            raise SpecRagError("every phase needs max_new_tokens >= 1")
        if max_forced_tokens < 0:
            raise SpecRagError(f"max_forced_tokens must be >= 0 (got {max_forced_tokens})")
        if any(p.penalized for p in ([sampling] if isinstance(sampling, SamplingParams) else sampling)):
            raise SpecRagError("penalties are not supported with phases (a phase change rewrites the prompt)")
        reserve = sum(ph.max_new_tokens for ph in phases) + (max_forced_tokens if len(phases) > 1 else 0)
        req = self._generate_request(prefix, suffixes, sampling, reserve, None, None, speculation)
        req.phases, req.between, req.max_forced_tokens = list(phases), between, max_forced_tokens
        return self._enqueue(req, timeout)

    def submit_score(self, prefix: Sequence[int], tree: Tree, timeout: float | None = None) -> Request:
        """Queue scoring of a token tree over ``prefix`` (the prefix K/V is cached, the tree's is dropped)."""
        prefix = [int(t) for t in prefix]
        if not prefix:
            raise SpecRagError("a scored tree needs a non-empty prefix")
        if not tree.tokens or len(tree.rows) != len(tree.targets):
            raise SpecRagError("a scored tree needs tokens and one target per row")
        if max(tree.positions) >= self.runner.max_seq_len:
            raise SpecRagError(f"the tree needs positions up to {max(tree.positions)}; the context is "
                               f"{self.runner.max_seq_len} tokens")
        return self._enqueue(Request("score", prefix, tree=tree), timeout)

    def _enqueue(self, req: Request, timeout: float | None) -> Request:
        need = worst_case_pages(req, self.runner.page_size, self.runner.max_seq_len)
        total = self.runner.allocator.num_usable
        if need > total:
            raise SpecRagError(f"request needs {need} KV pages; the {self.name} pool has {total}")
        req.deadline = None if timeout is None else time.perf_counter() + timeout
        req._engine = self
        with self._cv:
            if not self._accepting:
                raise EngineStopped(f"engine {self.name} is not accepting requests")
            if len(self._queue) >= self.config.max_queue:
                raise QueueFull(f"engine {self.name} queue is full ({self.config.max_queue} waiting)")
            self._queue.append(req)
            self._cv.notify_all()
        return req

    # ------------------------------------------------------------------ counters
    def stats(self) -> dict:
        """Live counters (pages free/cached/total, queue depth, running, hit rate, tokens/s, ...)."""
        with self._state:
            now = time.perf_counter()
            while self._recent and self._recent[0][0] < now - 10.0:
                self._recent.popleft()
            window = now - self._recent[0][0] if self._recent else 0.0
            alloc = self.runner.allocator
            return {
                "pages_free": alloc.num_free, "pages_cached": self.cache.num_cached_only,
                "pages_total": alloc.num_usable, "queue_depth": len(self._queue),
                "running_requests": len(self._running),
                "running_seqs": sum(s.finish is None and s.sampling is not None
                                    for r in self._running for s in r.seqs),
                "prefix_hit_rate": self.cache.hit_rate, "prefix_hit_tokens": self.cache.hit_tokens,
                "prefix_lookup_tokens": self.cache.lookup_tokens,
                "tokens_per_s": sum(n for _, n in self._recent) / max(window, 1.0) if self._recent else 0.0,
                "prefill_chunk": self.backpressure.chunk, **dict(self.counters),
            }

    def reset_prefix_cache(self) -> int:
        """Evict every page only the prefix cache holds (cold-cache measurements); returns the pages freed."""
        with self._state:
            return self.cache.clear()

    def stage(self, stage: str, seconds: float) -> None:
        if self._on_stage is not None:
            self._on_stage(self.name, stage, seconds)

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._running and not self._stop:
                    self._cv.wait()
                if self._stop and not self._queue and not self._running:
                    return
            try:
                self._iteration()
            except Exception as exc:  # a bug must not kill the loop: fail what is in flight, keep serving
                with self._state:
                    for req in list(self._queue) + list(self._running):
                        self._finish(req, EngineError(f"engine error: {exc}"))

    def _iteration(self) -> None:
        with self._state:
            self._reap()
            self._admit()
            work = self._steps.build()
        if work is None:
            with self._cv:
                self._cv.wait(timeout=0.005)
            return
        try:
            outcome = work.run(self.runner, self.config)
            with self._state:
                self._steps.dispatch(work, outcome)
        except Exception as exc:  # a failed step fails the requests in it
            with self._state:
                for req in {id(r): r for r in work.requests}.values():
                    self._finish(req, EngineError(f"engine step failed: {exc}"))

    def _reap(self) -> None:
        now = time.perf_counter()
        for req in list(self._queue) + list(self._running):
            if req.cancelled:
                self._finish(req, RequestCancelled("request cancelled"))
            elif req.deadline is not None and now > req.deadline:
                self._finish(req, RequestTimeout("request timed out"))

    def _admit(self) -> None:
        while self._queue:
            running = sum(len(r.seqs) or 1 for r in self._running)
            req = self._queue[0]
            if running and running + max(len(req.seqs), len(req.suffixes), 1) > self.config.max_running:
                return
            if not self.admitter.admit(req):
                return  # head of line waits for pages
            self._queue.popleft()
            if req.speculation is not None:
                for s in req.seqs:
                    s.spec_stats = SpeculationStats()
            req.admitted_at = time.perf_counter()
            self.stage("queue", req.admitted_at - req.submitted_at)
            self._running.append(req)
            self.counters["admitted"] += 1
            self.counters["peak_running_requests"] = max(self.counters["peak_running_requests"], len(self._running))
            p = req.prefix_seq
            if req.kind == "generate" and p is not None and p.prefilled == len(p.prompt):
                self.prefix_ready(req)

    # ------------------------------------------------------------------ used by the step builder
    def prefix_ready(self, req: Request) -> None:
        """A group's shared prefix is in the pool: its branches may run; the prefix sequence lets go."""
        for s in req.seqs:
            s.ready = True
        self.admitter.release(Request("generate", [], seqs=[req.prefix_seq]))  # type: ignore[list-item]
        req.prefix_seq = None

    def record_tokens(self, n: int) -> None:
        self._recent.append((time.perf_counter(), n))
        self.counters["generated_tokens"] += n

    def running_requests(self) -> list[Request]:
        return self._running

    def _finish(self, req: Request, error: BaseException | None = None, value=None) -> None:
        self.admitter.release(req)
        if req in self._running:
            self._running.remove(req)
        if req in self._queue:
            self._queue.remove(req)
        self.counters["failed" if error else "completed"] += 1
        if error is not None and isinstance(error, (RequestCancelled, RequestTimeout)):
            self.counters["cancelled" if isinstance(error, RequestCancelled) else "timed_out"] += 1
        if not req.future.done():
            if error is not None:
                req.future.set_exception(error)
            else:
                req.future.set_result(value)

    def fail(self, req: Request, error: BaseException) -> None:
        """End a request with an error (its pages return to the pool)."""
        self._finish(req, error if isinstance(error, SpecRagError) else EngineError(f"engine error: {error}"))

    def complete(self, req: Request) -> None:
        now = time.perf_counter()
        if req.kind == "score":
            return
        results = [self.result_of(s) for s in req.seqs]
        if req.phases:  # one list per phase: the earlier phases' results were kept as each branch moved on
            results = [[s.phase_results[p] for s in req.seqs] for p in range(len(req.phases) - 1)] + [results]
        self.stage("request", now - req.submitted_at)
        self._finish(req, value=results)

    @staticmethod
    def result_of(s) -> GenerationResult:
        """The result of a sequence's current (just finished) phase."""
        start = s.req.admitted_at if not s.phase_results else s.phase_started_at
        return GenerationResult(list(s.out), list(s.logprobs), s.finish or "length", len(s.prompt),
                                s.prefill_done_at - start, s.finished_at - s.prefill_done_at,
                                shared_prefix_tokens=s.req.shared_len, speculation=s.spec_stats,
                                top_logprobs=list(s.top_logprobs) if s.sampling.top_logprobs else None)

    def complete_score(self, req: Request, logprobs: np.ndarray) -> None:
        self.stage("request", time.perf_counter() - req.submitted_at)
        self._finish(req, value=logprobs)
