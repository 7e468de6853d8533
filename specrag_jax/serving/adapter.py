"""Engine-backed models for the pipeline: the same executor interface as ``Generator``, served by an Engine.

``EngineTextModel`` is a ``TextModel`` whose generator submits to a shared engine and blocks on the future,
so the unchanged pipeline (drafting, verification, the baselines) runs one request per worker thread while
the engines batch the work of all requests. A ``RequestContext`` carries one HTTP request's deadline and
cancellation to every engine call it makes.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Sequence

import numpy as np

from specrag_jax.models.generation import BetweenFn, GenerationResult, Phase
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation
from specrag_jax.models.text_model import TextModel
from specrag_jax.serving.engine import Engine
from specrag_jax.serving.requests import Request, RequestCancelled, RequestTimeout, StopFn, Tree

EventFn = Callable[[dict], None]


class RequestContext:
    """Deadline, cancellation and stage events of one client request (shared by its engine calls)."""

    def __init__(self, timeout: float | None = None, on_event: EventFn | None = None) -> None:
        self.deadline = None if timeout is None else time.perf_counter() + timeout
        self.on_event = on_event
        self._cancelled = threading.Event()
        self._pending: set[Request] = set()
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def remaining(self) -> float | None:
        """Seconds left (None = no deadline); raises when cancelled or past the deadline."""
        if self.cancelled:
            raise RequestCancelled("request cancelled")
        if self.deadline is None:
            return None
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise RequestTimeout("request timed out")
        return left

    def cancel(self) -> None:
        """Cancel every engine request in flight and all later ones."""
        self._cancelled.set()
        with self._lock:
            for req in self._pending:
                req.cancel()

    def emit(self, event: dict) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def track(self, submit: Callable[[float | None], Request]) -> Request:
        """Submit without blocking; the request is cancelled with the context until ``untrack``."""
        req = submit(self.remaining())
        with self._lock:
            self._pending.add(req)
            if self.cancelled:
                req.cancel()
        return req

    def untrack(self, req: Request) -> None:
        with self._lock:
            self._pending.discard(req)

    def wait(self, submit: Callable[[float | None], Request]):
        """Submit (with the time left as the engine timeout) and block on the result."""
        req = submit(self.remaining())
        with self._lock:
            self._pending.add(req)
            if self.cancelled:
                req.cancel()
        try:
            return req.future.result(None if self.deadline is None else max(self.deadline - time.perf_counter(), 0))
        except FutureTimeout:
            req.cancel()
            raise RequestTimeout("request timed out") from None
        finally:
            with self._lock:
                self._pending.discard(req)


class PrefillHandle:
    """A prefill-only engine request in flight (progressive prefill): ``wait()`` for it or ``cancel()`` it."""

    def __init__(self, ctx: RequestContext, req: Request) -> None:
        self.ctx, self.req = ctx, req

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served at its admission (0 until admitted)."""
        return self.req.cached_tokens

    def wait(self) -> None:
        """Block until its prompts are prefilled (and in the prefix cache); raises what the request raised."""
        try:
            deadline = self.ctx.deadline
            self.req.future.result(None if deadline is None else max(deadline - time.perf_counter(), 0))
        except FutureTimeout:
            self.req.cancel()
            raise RequestTimeout("request timed out") from None
        finally:
            self.ctx.untrack(self.req)

    def cancel(self) -> None:
        """Drop it (the engine returns its pages on its next step; finished pages stay in the cache)."""
        self.req.cancel()
        self.ctx.untrack(self.req)


class EngineGenerator:
    """``Generator``'s interface (generate, generate_branches, generate_phases, score_tree, check_prompt) over
    an Engine, plus ``start_prefill`` (only an engine keeps prefilled K/V for later requests: its prefix cache)."""

    def __init__(self, engine: Engine, ctx: RequestContext, role: str = "") -> None:
        self.engine, self.ctx, self.role = engine, ctx, role
        self.runner = engine.runner
        self.eos_ids = engine.eos_ids

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        self.engine.check_prompt(prompt, max_new_tokens)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling=SamplingParams(),
        max_new_tokens: int = 64,
        stop_fn: StopFn | None = None,
        speculation: Speculation | None = None,
    ) -> list[GenerationResult]:
        return self.generate_branches([], prompts, sampling, max_new_tokens, stop_fn, speculation)

    def generate_branches(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        sampling=SamplingParams(),
        max_new_tokens: int = 64,
        stop_fn: StopFn | None = None,
        speculation: Speculation | None = None,
    ) -> list[GenerationResult]:
        """``speculation``: decode with token trees in the engine (as ``Generator.generate``'s)."""
        self.ctx.emit({"event": "stage", "stage": f"{self.role}_generate", "branches": len(suffixes)})
        return self.ctx.wait(
            lambda t: self.engine.submit_generate(
                prefix, suffixes, sampling, max_new_tokens, stop_fn, timeout=t, speculation=speculation
            )
        )

    def generate_phases(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        phases: Sequence[Phase],
        between: BetweenFn | None = None,
        sampling=SamplingParams(),
        speculation: Speculation | None = None,
    ) -> list[list[GenerationResult]]:
        self.ctx.emit(
            {"event": "stage", "stage": f"{self.role}_generate", "branches": len(suffixes), "phases": len(phases)}
        )
        return self.ctx.wait(
            lambda t: self.engine.submit_phases(
                prefix, suffixes, phases, between, sampling, timeout=t, speculation=speculation
            )
        )

    def start_prefill(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]]) -> PrefillHandle:
        """Prefill ``prefix + suffix`` for every suffix into the prefix cache without waiting (progressive
        prefill): one engine request under the usual admission and backpressure, one sampled token per branch
        (discarded; the engine's requests sample at least one), pages back to the pool (cache-held) at its end."""
        self.ctx.emit({"event": "stage", "stage": f"{self.role}_prefill", "branches": len(suffixes)})
        return PrefillHandle(
            self.ctx,
            self.ctx.track(lambda t: self.engine.submit_generate(prefix, suffixes, SamplingParams(), 1, timeout=t)),
        )

    def score_tree(
        self,
        prefix: Sequence[int],
        tokens: Sequence[int],
        parents: Sequence[int],
        positions: Sequence[int],
        rows: Sequence[int],
        targets: Sequence[int],
    ) -> np.ndarray:
        self.ctx.emit({"event": "stage", "stage": f"{self.role}_score", "tree_tokens": len(tokens)})
        tree = Tree(list(tokens), list(parents), list(positions), list(rows), list(targets))
        return self.ctx.wait(lambda t: self.engine.submit_score(prefix, tree, timeout=t))


class EngineTextModel(TextModel):
    """A loaded model whose generation and scoring go through a shared engine, for one request context."""

    def __init__(self, base: TextModel, engine: Engine, ctx: RequestContext, role: str = "") -> None:
        super().__init__(base.name, base.runner, base.tokenizer, base.load_s, instruct=base.instruct)
        self.generator = EngineGenerator(engine, ctx, role or engine.name)  # type: ignore[assignment]
