"""Loading a model's stored step programs ahead of need, on a background thread, while the process loads.

A new process pays for every step program it runs: lowering the stored export, then loading the compiled
program from JAX's persistent cache (linking its kernels' object files: 0.3-2 s a program on this CPU). Those
loads used to happen one by one on the thread that needed them, in the middle of drafting and verification.
``RecentSteps`` remembers which stored steps a model used, in the order the last process first used them;
``AheadLoader`` loads those on one background thread as soon as the model is placed, so they overlap weight
loading, tokenisation and retrieval; the thread takes them in the order the last process first needed them
(seconds since its start), whichever model registered them first. The thread that needs a program takes it
when it is ready, waits while it is being loaded, or loads it itself if the background thread has not reached
it yet (each program is loaded once). The programs are the same ones, so outputs do not change; only when
the time is spent does.
"""

from __future__ import annotations

import atexit
import functools
import heapq
import itertools
import json
import os
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Sequence

from specrag_jax.compile_time import background_compiles

KEEP = 64  # names a RecentSteps file remembers
MISSING = object()  # ``AheadLoader.take``: not loaded ahead, the caller loads it
_limit = [0]  # programs per model to load ahead (0: off); the CLI turns it on
_START = time.monotonic()  # about when this process started: first uses are recorded as seconds after it


def set_prefetch(limit: int) -> None:
    """Load up to ``limit`` recently used step programs per model ahead of need (0 turns it off)."""
    _limit[0] = max(int(limit), 0)


def prefetch_limit() -> int:
    return _limit[0]


class RecentSteps:
    """The stored steps one model used: this process's first uses in order, then the earlier processes'. Each
    is kept with which of its step inputs were committed to a device ("c") or not ("u"), as jit keys on that,
    and when its process first needed it (seconds after the process started)."""

    def __init__(self, path: Path, keep: int = KEEP) -> None:
        self.path, self.keep = path, keep
        try:
            old = json.loads(path.read_text())
            rows = old if isinstance(old, list) else []
            self._old = {e[0]: (e[1], float(e[2])) for e in rows if _is_entry(e)}
        except (OSError, ValueError):
            self._old = {}
        self._session: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    @property
    def entries(self) -> list[tuple[str, str, float]]:
        """(step file name, committed-ness of its step inputs, seconds into its process), most recent first."""
        with self._lock:
            merged = {**self._session, **{n: e for n, e in self._old.items() if n not in self._session}}
        return [(name, committed, at) for name, (committed, at) in merged.items()]

    def used(self, name: str, committed: str) -> None:
        """Record a first use in this process (written at once, atomically; a write failure is ignored)."""
        with self._lock:
            if name in self._session:
                return
            self._session[name] = (committed, round(time.monotonic() - _START, 3))
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps([list(e) for e in self.entries[: self.keep]]))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)


def _is_entry(entry: Any) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 3
        and all(isinstance(x, str) for x in entry[:2])
        and isinstance(entry[2], (int, float))
    )


class AheadLoader:
    """One model's programs loaded ahead; ``take`` hands each to the thread that needs it. Every model's loads
    go through one worker thread per process, soonest needed first, so loading ahead never takes more than one
    core from the work it runs beside."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed: set[str] = set()
        self._futures: dict[str, Future] = {}

    def start(self, items: Sequence[tuple[str, float]], load: Callable[[str], Any]) -> None:
        """Queue each (name, when it is needed) for ``load(name)`` on the worker thread (a failed load yields
        None); the worker takes the soonest needed of every model's queued names first."""
        with self._lock:
            todo = [(n, at) for n, at in dict(items).items() if n not in self._claimed and n not in self._futures]
            for name, _ in todo:
                self._futures[name] = Future()
        for name, at in todo:
            _WORKER.put(at, functools.partial(self._load, name, load))

    def _load(self, name: str, load: Callable[[str], Any]) -> None:
        with self._lock:
            if name in self._claimed:
                return
            self._claimed.add(name)
            future = self._futures[name]  # ``take`` may hand it over (and drop it here) while this loads
        result = None
        try:
            result = load(name)
        except Exception:  # the thread that needs it loads it again and reports the failure
            pass
        finally:
            future.set_result(result)

    def take(self, name: str) -> Any:
        """The program loaded ahead (None if that failed), waiting while it loads; ``MISSING`` when the worker has
        not started it (it then never will: the caller loads it). Handed over once: the loader keeps no reference,
        so a program its caller drops is freed, and a later ``take`` of it is ``MISSING``."""
        with self._lock:
            if name not in self._claimed:
                self._claimed.add(name)
                return MISSING
            future = self._futures.pop(name, None)
        return MISSING if future is None else future.result()


class _Worker:
    """The process's one background thread for loads ahead, soonest needed first (a daemon, stopped before the
    interpreter exits)."""

    def __init__(self) -> None:
        self._jobs: list[tuple[float, int, Callable[[], None]]] = []  # a heap by (when needed, arrival)
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def put(self, at: float, job: Callable[[], None]) -> None:
        with self._ready:
            if self._stopped:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specrag-step-prefetch", daemon=True)
                self._thread.start()
                atexit.register(self.stop)  # never tear the interpreter down under a thread inside XLA
            heapq.heappush(self._jobs, (at, next(self._order), job))
            self._ready.notify()

    def _run(self) -> None:
        with background_compiles():
            while True:
                with self._ready:
                    while not self._jobs and not self._stopped:
                        self._ready.wait()
                    if self._stopped:
                        return
                    _, _, job = heapq.heappop(self._jobs)
                job()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every load queued so far has run (True) or ``timeout`` seconds pass (False)."""
        done = threading.Event()
        with self._ready:
            if self._thread is None or self._stopped:
                return True
        self.put(float("inf"), done.set)  # after every queued load
        return done.wait(timeout)

    def stop(self) -> None:
        """Start nothing more and wait for the load under way."""
        with self._ready:
            self._stopped = True
            self._ready.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


_WORKER = _Worker()


def wait_for_loads(timeout: float | None = None) -> bool:
    """Wait until every load ahead queued so far has run (benchmarks and tests; False on timeout)."""
    return _WORKER.drain(timeout)
