"""Engine: one model's continuous-batching step loop over its fixed page pool.

A background thread repeatedly (1) drops cancelled and timed-out requests, (2) admits queued requests whose
pages fit (``admission.py``), (3) gathers the ready work of every running request -- decode tokens, prefill
chunks, verification trees -- into one ragged batch under the token budget, (4) runs ONE jitted step on the
model's ``ModelRunner`` (``pack`` pads to buckets) and (5) hands results back through futures. Sampling,
speculation (token trees, ``spec_steps.py``) and scoring steps take turns when several kinds of work wait
(the runner has one program per kind).
Callers on other threads only enqueue, cancel, read counters and hand the loop work to run between two steps
(``seed_prefixes``: K/V computed elsewhere put into the prefix cache). The engine's pages, requests and counters
are its ``EngineState`` (``state.py``), which the step builders work on.

The same loop runs offline without a thread: ``drive(req)`` runs its iterations on the caller's thread until
``req`` is done (``models.generation.Generator``, the synchronous face ask, eval and the Python API use).
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from specrag_jax.compile_time import thread_compile_s
from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.admission import Admitter, worst_case_pages
from specrag_jax.models.engine.policy import Backpressure, SchedulerConfig
from specrag_jax.models.engine.prefix_cache import PrefixCache
from specrag_jax.models.engine.prefix_seed import Seed, seed_prefixes
from specrag_jax.models.engine.requests import (
    EngineError,
    EngineStopped,
    QueueFull,
    Request,
    RequestCancelled,
    RequestTimeout,
    StopFn,
    TokenFn,
    Tree,
)
from specrag_jax.models.engine.rules import BetweenFn, Phase
from specrag_jax.models.engine.state import EngineState, StageFn
from specrag_jax.models.engine.steps import StepBuilder
from specrag_jax.models.engine.warmup import WarmupReport, warmup
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation, SpeculationStats, check_can_speculate

# Score a tree's prefix inside the tree's own step when no prefix cache would keep its K/V (the offline engines):
# a benchmark switch (benchmarks/verification_pass.py --knob inline-prefix), read when a tree is submitted.
INLINE_TREE_PREFIX = True


class Engine:
    """Continuous batching for one model. Start with ``start()``; ``stop(drain=True)`` finishes in-flight work."""

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
        self.state = EngineState(
            runner, eos_ids, name=name, config=config, prefix_cache=prefix_cache, on_stage=on_stage
        )
        self._cv = threading.Condition()
        self._steps = StepBuilder(self.state)
        self._thread: threading.Thread | None = None
        self._driver = threading.Lock()  # one iteration at a time when callers drive the loop themselves
        self._accepting = True  # until ``stop()``: queued work waits for ``start()`` or ``drive()``
        self._stop = False
        self._jobs: collections.deque[tuple[Callable[[], object], Future]] = collections.deque()  # between steps

    # ------------------------------------------------------------------ the state's parts
    @property
    def name(self) -> str:
        return self.state.name

    @property
    def runner(self) -> ModelRunner:
        return self.state.runner

    @property
    def config(self) -> SchedulerConfig:
        return self.state.config

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.state.eos_ids

    @property
    def cache(self) -> PrefixCache:
        return self.state.cache

    @property
    def admitter(self) -> Admitter:
        return self.state.admitter

    @property
    def backpressure(self) -> Backpressure:
        return self.state.backpressure

    @property
    def counters(self) -> collections.Counter:
        return self.state.counters

    @property
    def on_stage(self) -> StageFn | None:
        """Told ``(engine, stage, seconds)`` of every queue wait, step and request (the metrics' hook)."""
        return self.state.on_stage

    @on_stage.setter
    def on_stage(self, fn: StageFn | None) -> None:
        self.state.on_stage = fn

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Refuse a prompt the context cannot hold with ``max_new_tokens`` more."""
        self.state.check_prompt(prompt, max_new_tokens)

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

    def warmup(
        self, level: str = "full", sampled: bool = True, score: bool = True, spec_budget: int | None = None
    ) -> WarmupReport:
        """Compile the step shapes this engine can reach (``warmup.py``; ``spec_budget``: also speculation
        steps with trees up to that budget); before ``start()``."""
        return warmup(self, level, sampled, score, spec_budget=spec_budget)

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Refuse new work; with ``drain`` finish what is queued and running, else cancel it; join the loop."""
        with self._cv:
            self._accepting = False
            if not drain:
                for r in list(self.state.queue) + self.state.running:
                    r.cancelled = True
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None

    def drive(self, req: Request):
        """Run the step loop on this thread until ``req`` is done and return its result (raise its error).

        For an engine that is not started (the offline path); every queued request advances with ``req``.
        A request that cannot be admitted while nothing runs fails rather than waiting forever."""
        if self._thread is not None:
            raise SpecRagError(f"engine {self.name} runs its own loop: wait on the request's future")
        st = self.state
        while not req.future.done():
            with self._driver:
                if req.future.done():
                    break
                try:
                    stepped = self._iteration()
                except Exception as exc:  # as the loop thread: fail what is in flight
                    with st.lock:
                        st.fail_all(exc)
                    continue
                if not stepped:
                    with st.lock:
                        if not st.running and st.queue:
                            head = st.queue[0]
                            st.finish(head, EngineError(f"engine {self.name} cannot admit the request: pages held"))
        return req.future.result()

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def seed_prefixes(self, seeds: Sequence[Seed]) -> int:
        """Put K/V computed elsewhere into the prefix cache (``prefix_seed.py``: full pages not yet cached, each
        loader called only when needed), between two steps; blocks until done and returns the pages added."""
        if not seeds or not self.cache.enabled:
            return 0
        return self._between_steps(lambda: seed_prefixes(self.state, seeds))

    def _between_steps(self, fn: Callable[[], object]):
        """Run ``fn`` with the state's lock held and no step in flight: on the loop's thread when started."""
        if self._thread is None:
            with self._driver, self.state.lock:
                return fn()
        if threading.current_thread() is self._thread:  # a callback inside a step: waiting would never end
            raise SpecRagError(f"engine {self.name}: work between steps cannot be asked for from its own loop")
        done: Future = Future()
        with self._cv:
            if not self._accepting:
                raise EngineStopped(f"engine {self.name} is not accepting requests")
            self._jobs.append((fn, done))
            self._cv.notify_all()
        return done.result()

    def _run_jobs(self) -> None:
        while self._jobs:
            fn, done = self._jobs.popleft()
            try:
                done.set_result(fn())
            except Exception as exc:  # the caller gets it; the loop goes on
                done.set_exception(exc)

    # ------------------------------------------------------------------ submission
    def submit_generate(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        max_new_tokens: int = 64,
        stop_fn: StopFn | None = None,
        on_token: TokenFn | None = None,
        timeout: float | None = None,
        speculation: Speculation | None = None,
    ) -> Request:
        """Queue a continuation of ``prefix + suffix`` for every suffix (shared prefix pages, one group).

        ``speculation``: decode with token trees (greedy output is plain greedy decoding's)."""
        if max_new_tokens < 1:
            raise SpecRagError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
        return self._enqueue(
            self._generate_request(prefix, suffixes, sampling, max_new_tokens, stop_fn, on_token, speculation), timeout
        )

    def _generate_request(
        self, prefix, suffixes, sampling, max_new_tokens: int, stop_fn, on_token, speculation: Speculation | None = None
    ) -> Request:
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
            raise SpecRagError(
                f"{sum(p.penalized for p in params)} penalised prompts in one request; the engine "
                f"holds {self.runner.penalties.capacity} at once"
            )
        prefix = [int(t) for t in prefix]
        suffixes = [[int(t) for t in s] for s in suffixes]
        for s in suffixes:
            self.state.check_prompt(prefix + s, max_new_tokens)
        return Request("generate", prefix, suffixes, params, max_new_tokens, stop_fn, on_token, speculation=speculation)

    def submit_phases(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        phases: Sequence[Phase],
        between: BetweenFn | None = None,
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        max_forced_tokens: int = 32,
        timeout: float | None = None,
        speculation: Speculation | None = None,
    ) -> Request:
        """Queue phased work (``Generator.generate_phases``): each branch keeps its K/V from one phase to the next.

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
        """Queue scoring of a token tree over ``prefix`` (the prefix K/V is cached, the tree's is dropped; without a
        prefix cache a prefix that fits the token budget with its tree is scored in the tree's step, never stored)."""
        prefix = [int(t) for t in prefix]
        if not prefix:
            raise SpecRagError("a scored tree needs a non-empty prefix")
        if not tree.tokens or len(tree.rows) != len(tree.targets):
            raise SpecRagError("a scored tree needs tokens and one target per row")
        if max(tree.positions) >= self.runner.max_seq_len:
            raise SpecRagError(
                f"the tree needs positions up to {max(tree.positions)}; the context is {self.runner.max_seq_len} tokens"
            )
        req = Request("score", prefix, tree=tree)
        fits = len(prefix) + len(tree.tokens) <= self.config.token_budget
        if INLINE_TREE_PREFIX and not self.cache.enabled and fits:
            req.inline_prefix = True  # no cache would keep its K/V: one step for prefix and tree, not two
        return self._enqueue(req, timeout)

    def _enqueue(self, req: Request, timeout: float | None) -> Request:
        need = worst_case_pages(req, self.runner.page_size, self.runner.max_seq_len)
        total = self.runner.allocator.num_usable
        if need > total:
            raise SpecRagError(f"request needs {need} KV pages; the {self.name} pool has {total}")
        req.deadline = None if timeout is None else time.perf_counter() + timeout
        req.on_cancel = self.wake
        with self._cv:
            if not self._accepting:
                raise EngineStopped(f"engine {self.name} is not accepting requests")
            if len(self.state.queue) >= self.config.max_queue:
                raise QueueFull(f"engine {self.name} queue is full ({self.config.max_queue} waiting)")
            self.state.queue.append(req)
            self._cv.notify_all()
        return req

    # ------------------------------------------------------------------ counters
    def stats(self) -> dict:
        """Live counters (pages free/cached/total, queue depth, running, hit rate, tokens/s, ...)."""
        st = self.state
        with st.lock:
            now = time.perf_counter()
            while st.recent and st.recent[0][0] < now - 10.0:
                st.recent.popleft()
            window = now - st.recent[0][0] if st.recent else 0.0
            alloc = self.runner.allocator
            return {
                "pages_free": alloc.num_free,
                "pages_cached": self.cache.num_cached_only,
                "pages_total": alloc.num_usable,
                "queue_depth": len(st.queue),
                "running_requests": len(st.running),
                "running_seqs": sum(s.finish is None and s.sampling is not None for r in st.running for s in r.seqs),
                "prefix_hit_rate": self.cache.hit_rate,
                "prefix_hit_tokens": self.cache.hit_tokens,
                "prefix_lookup_tokens": self.cache.lookup_tokens,
                "tokens_per_s": sum(n for _, n in st.recent) / max(window, 1.0) if st.recent else 0.0,
                "prefill_chunk": self.backpressure.chunk,
                **dict(self.counters),
            }

    def reset_prefix_cache(self) -> int:
        """Evict every page only the prefix cache holds (cold-cache measurements); returns the pages freed."""
        with self.state.lock:
            return self.cache.clear()

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        st = self.state
        while True:
            with self._cv:
                while not st.queue and not st.running and not self._jobs and not self._stop:
                    self._cv.wait()
                leaving = self._stop and not st.queue and not st.running  # no job can be queued after this
            if leaving:
                with st.lock:
                    self._run_jobs()
                return
            try:
                self._iteration()
            except Exception as exc:  # a bug must not kill the loop: fail what is in flight, keep serving
                with st.lock:
                    st.fail_all(exc)

    def _iteration(self) -> bool:
        """One step; False when nothing was ready (the loop waits a moment before the next try)."""
        with self.state.lock:
            self._run_jobs()
            self._reap()
            self._admit()
            work = self._steps.build()
        if work is None:
            if self._thread is not None:
                with self._cv:
                    self._cv.wait(timeout=0.005)
            return False
        try:
            outcome = work.run(self.runner, self.config)
            with self.state.lock:
                self._steps.dispatch(work, outcome)
        except Exception as exc:  # a failed step fails the requests in it
            with self.state.lock:
                for req in {id(r): r for r in work.requests}.values():
                    self.state.finish(req, EngineError(f"engine step failed: {exc}"))
        return True

    def _reap(self) -> None:
        now = time.perf_counter()
        st = self.state
        for req in list(st.queue) + list(st.running):
            if req.cancelled:
                st.finish(req, RequestCancelled("request cancelled"))
            elif req.deadline is not None and now > req.deadline:
                st.finish(req, RequestTimeout("request timed out"))

    def _admit(self) -> None:
        st = self.state
        while st.queue:
            running = sum(len(r.seqs) or 1 for r in st.running)
            req = st.queue[0]
            if running and running + max(len(req.seqs), len(req.suffixes), 1) > self.config.max_running:
                return
            if not self.admitter.admit(req):
                return  # head of line waits for pages
            st.queue.popleft()
            if req.speculation is not None:
                for s in req.seqs:
                    s.spec_stats = SpeculationStats()
            req.admitted_at, req.admitted_compile_s = time.perf_counter(), thread_compile_s()
            st.stage("queue", req.admitted_at - req.submitted_at)
            st.running.append(req)
            self.counters["admitted"] += 1
            self.counters["peak_running_requests"] = max(self.counters["peak_running_requests"], len(st.running))
            p = req.prefix_seq
            if req.kind == "generate" and p is not None and p.prefilled == len(p.prompt):
                st.prefix_ready(req)
