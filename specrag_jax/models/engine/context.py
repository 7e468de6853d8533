"""A caller's deadline, cancellation and stage events, shared by every engine request it makes, and a prefill
request left in flight (progressive prefill)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

from specrag_jax.models.engine.requests import Request, RequestCancelled, RequestTimeout

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
        req = self.track(submit)
        try:
            return req.future.result(None if self.deadline is None else max(self.deadline - time.perf_counter(), 0))
        except FutureTimeout:
            req.cancel()
            raise RequestTimeout("request timed out") from None
        finally:
            self.untrack(req)


class PrefillHandle:
    """A prefill-only engine request in flight (progressive prefill): ``wait()`` for it or ``cancel()`` it."""

    def __init__(self, ctx: RequestContext, req: Request, drive: Callable[[Request], object] | None = None) -> None:
        """``drive``: runs the engine's loop until the request is done (an engine without its own thread)."""
        self.ctx, self.req, self.drive = ctx, req, drive

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served at its admission (0 until admitted)."""
        return self.req.cached_tokens

    def wait(self) -> None:
        """Block until its prompts are prefilled (and in the prefix cache); raises what the request raised."""
        try:
            if self.drive is not None:
                self.drive(self.req)
                return
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


__all__ = ["EventFn", "PrefillHandle", "RequestContext"]
