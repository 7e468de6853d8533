"""One-time compilation time, measured from JAX's own monitoring events.

Latency numbers in ``specrag eval`` and the benchmarks are reported without XLA compilation (a serving engine
compiles its shapes once, at warm-up); ``CompileClock`` measures what to subtract, and it is reported too.
"""

from __future__ import annotations

import threading

import jax

_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_lock = threading.Lock()
_total = [0.0]
_installed = [False]


def _listener(event: str, duration_secs: float, **_kwargs) -> None:
    if event in _EVENTS:
        with _lock:
            _total[0] += float(duration_secs)


def compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling since the first call."""
    with _lock:
        if not _installed[0]:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _installed[0] = True
        return _total[0]


class CompileClock:
    """``with CompileClock() as c: ...`` then ``c.seconds`` is the compilation time spent inside the block."""

    def __enter__(self) -> "CompileClock":
        self._start = compile_seconds()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = compile_seconds() - self._start


__all__ = ["CompileClock", "compile_seconds"]
