"""Stage progress for the command line: a callback interface whose default does nothing.

``SpecRAG(..., progress=StderrProgress())`` (or ``rag.progress = ...``) reports each stage as it starts and
ends; library users get ``NO_PROGRESS`` and nothing is printed. ``StderrProgress`` writes one line per
finished stage (``drafting: 5 drafts, 1915 prompt + 192 new tokens 12.3 s``). On a terminal it also shows
the running stage (``drafting ...``) and completes or erases that line, so a failure still ends in the
single ``specrag: error: ...`` line; into a pipe or file it writes finished stages only.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import IO, Iterator


class Progress:
    """Stage callbacks (no-ops here); subclass and override what you need."""

    def start(self, stage: str) -> None:
        """``stage`` begins."""

    def end(self, stage: str, seconds: float, detail: str = "") -> None:
        """``stage`` finished after ``seconds``; ``detail`` says what it did (counts)."""

    def fail(self, stage: str) -> None:
        """``stage`` raised; an error message follows."""

    def note(self, text: str) -> None:
        """A line that is not a timed stage."""


NO_PROGRESS = Progress()


class StderrProgress(Progress):
    """Short lines on stderr (or ``stream``); see the module docstring."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._pending: str | None = None

    @property
    def stream(self) -> IO[str]:
        return self._stream or sys.stderr  # the current stderr (tests swap it)

    def _live(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _clear(self) -> None:
        if self._pending is not None:
            self._write("\r\033[K")
            self._pending = None

    def start(self, stage: str) -> None:
        self._clear()
        if self._live():
            self._pending = stage
            self._write(f"{stage} ...")

    def end(self, stage: str, seconds: float, detail: str = "") -> None:
        self._clear()
        self._write(f"{stage}: {detail} {seconds:.2f} s\n" if detail else f"{stage} ... {seconds:.2f} s\n")

    def fail(self, stage: str) -> None:
        self._clear()

    def note(self, text: str) -> None:
        self._clear()
        self._write(text + "\n")


@contextlib.contextmanager
def stage(progress: Progress, name: str) -> Iterator[list[str]]:
    """``with stage(p, "loading") as detail: ...; detail.append("2 models")``: start, then end or fail."""
    detail: list[str] = []
    progress.start(name)
    t0 = time.perf_counter()
    try:
        yield detail
    except BaseException:
        progress.fail(name)
        raise
    progress.end(name, time.perf_counter() - t0, ", ".join(detail))


class _CurrentStderr(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record arrives."""

    @property  # type: ignore[override]
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def quiet_library_logs(level: int = logging.WARNING) -> None:
    """Give the root logger a stderr handler that drops records below ``level`` (default WARNING).

    Without a root handler the first ``absl.logging`` call (orbax, on import) runs ``logging.basicConfig()``,
    whose handler passes every level: any library that sets its own logger to DEBUG (bm25s does) then
    prints ``DEBUG:...`` lines. Does nothing when the root logger already has handlers (an application or
    pytest configured logging)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = _CurrentStderr()
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    root.addHandler(handler)


__all__ = ["NO_PROGRESS", "Progress", "StderrProgress", "quiet_library_logs", "stage"]
