"""One-time compilation time, measured from JAX's own monitoring events.

Latency numbers in ``specrag eval`` and the benchmarks are reported without XLA compilation (a serving engine
compiles its shapes once, at warm-up); ``CompileClock`` measures what to subtract, and it is reported too.

The total has three parts a program pays once per process: tracing to a jaxpr, lowering to MLIR, and the
backend step. A persistent-cache hit turns the backend step into loading the stored executable
(``cache_load_s``); tracing and lowering are paid in every new process, cache or not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Iterator

import jax

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_BACKEND = "/jax/core/compile/backend_compile_duration"  # one per program built (compiled or loaded)
_CACHE_LOAD = "/jax/compilation_cache/cache_retrieval_time_sec"
_HITS = "/jax/compilation_cache/cache_hits"  # a plain event, no duration
_DURATIONS = {_TRACE: "trace_s", _LOWER: "lower_s", _BACKEND: "backend_s", _CACHE_LOAD: "cache_load_s"}


@dataclasses.dataclass(frozen=True)
class CompileStats:
    """Totals of the compilation events: seconds per phase, programs built and persistent-cache hits."""

    trace_s: float = 0.0
    lower_s: float = 0.0
    backend_s: float = 0.0  # XLA compile, or the cache load on a hit
    cache_load_s: float = 0.0
    programs: int = 0
    cache_hits: int = 0

    @property
    def total_s(self) -> float:
        return self.trace_s + self.lower_s + self.backend_s

    @property
    def xla_compile_s(self) -> float:
        """Backend time spent compiling (cache misses only)."""
        return max(self.backend_s - self.cache_load_s, 0.0)

    def __sub__(self, other: "CompileStats") -> "CompileStats":
        return CompileStats(*(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)))

    def summary(self) -> str:
        """One line: ``XLA 1.6 s once (trace 0.9, lower 0.2, compile 0.0, cache load 0.6; 14/14 cached)``."""
        return (
            f"XLA {self.total_s:.1f} s once (trace {self.trace_s:.1f}, lower {self.lower_s:.1f}, "
            f"compile {self.xla_compile_s:.1f}, cache load {self.cache_load_s:.1f}; "
            f"{self.cache_hits}/{self.programs} programs from the disk cache)"
        )


_lock = threading.Lock()
_FIELDS = (*_DURATIONS.values(), "programs", "cache_hits")
_totals = {name: 0.0 for name in _FIELDS}  # the work's own threads
_background_totals = {name: 0.0 for name in _FIELDS}  # threads inside ``background_compiles`` (step prefetch)
_thread = threading.local()
_installed = [False]


def _counts() -> dict[str, float]:
    return _background_totals if getattr(_thread, "background", False) else _totals


def _own() -> dict[str, float]:
    """This thread's own totals (a stage's compile time is the thread's that runs it)."""
    if not hasattr(_thread, "totals"):
        _thread.totals = {name: 0.0 for name in _FIELDS}
    return _thread.totals


def _on_duration(event: str, duration_secs: float, **_kwargs) -> None:
    if event in _DURATIONS:  # JAX calls listeners on the thread that compiles
        with _lock:
            for counts in (_counts(), _own()):
                counts[_DURATIONS[event]] += float(duration_secs)
                counts["programs"] += event == _BACKEND


def _on_event(event: str, **_kwargs) -> None:
    if event == _HITS:
        with _lock:
            _counts()["cache_hits"] += 1
            _own()["cache_hits"] += 1


def _install() -> None:
    if not _installed[0]:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        jax.monitoring.register_event_listener(_on_event)
        _installed[0] = True


def _stats(t: dict[str, float]) -> CompileStats:
    return CompileStats(
        t["trace_s"], t["lower_s"], t["backend_s"], t["cache_load_s"], int(t["programs"]), int(t["cache_hits"])
    )


def compile_stats() -> CompileStats:
    """Totals since the first call of this function (or of ``compile_seconds``) in this process, on every
    thread but those in ``background_compiles``."""
    with _lock:
        _install()
        return _stats(dict(_totals))


def thread_compile_stats() -> CompileStats:
    """Totals of the calling thread alone since the first call of any of these functions in this process: what a
    stage running on this thread compiled, whatever other threads compiled meanwhile."""
    with _lock:
        _install()
        return _stats(dict(_own()))


def thread_compile_s() -> float:
    """This thread's one-time XLA seconds so far (``thread_compile_stats().total_s``): the engine marks it when a
    request starts, ends its prefill and ends, to split a request's compile seconds by phase."""
    return thread_compile_stats().total_s


def background_stats() -> CompileStats:
    """Totals of the threads inside ``background_compiles`` (programs loaded ahead of use, overlapped)."""
    with _lock:
        _install()
        return _stats(dict(_background_totals))


def background_summary() -> str:
    """``; 12 more loaded ahead in the background (5.1 s, overlapped)``, or "" when none were."""
    stats = background_stats()
    if not stats.programs:
        return ""
    return f"; {stats.programs} more loaded ahead in the background ({stats.total_s:.1f} s, overlapped)"


@contextlib.contextmanager
def background_compiles() -> Iterator[None]:
    """Count this thread's compilation events apart (``background_stats``): work ahead of need, whose time the
    work waiting for it sees only as waiting."""
    _install()
    _thread.background = True
    try:
        yield
    finally:
        _thread.background = False


def compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling since the first call."""
    return compile_stats().total_s


class CompileClock:
    """``with CompileClock() as c: ...`` then ``c.seconds`` is the compilation time spent inside the block
    and ``c.stats`` its ``CompileStats``."""

    def __enter__(self) -> "CompileClock":
        self._start = compile_stats()
        self.seconds = 0.0
        self.stats = CompileStats()
        return self

    def __exit__(self, *exc) -> None:
        self.stats = compile_stats() - self._start
        self.seconds = self.stats.total_s


__all__ = [
    "CompileClock",
    "CompileStats",
    "background_compiles",
    "background_stats",
    "background_summary",
    "compile_seconds",
    "compile_stats",
    "thread_compile_stats",
]
