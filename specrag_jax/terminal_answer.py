"""``TerminalAnswer``: ``specrag ask`` on a terminal writes the answer to stdout as it is decoded, while the stage
lines (``progress``, on stderr) keep lines of their own."""

from __future__ import annotations

import sys
from typing import IO

from specrag_jax.progress import Progress


class TerminalAnswer(Progress):
    """Wraps the command's ``Progress``: pass ``write`` as ``SpecRAG.answer``'s ``on_text`` and this object as the
    pipeline's progress; a stage line that arrives while the answer's line is open starts on a new line."""

    def __init__(self, progress: Progress, out: IO[str] | None = None) -> None:
        self.inner, self._out = progress, out
        self.written = ""  # the answer as shown so far
        self._open = False  # the answer's line has no newline yet

    @property
    def out(self) -> IO[str]:
        return self._out or sys.stdout

    def write(self, piece: str) -> None:
        """One piece of the answer's text (``on_text``)."""
        if not self.written:
            self.inner.note("answer:")  # a pending "stage ..." line ends before the answer starts
        self.written += piece
        self.out.write(piece)
        self.out.flush()
        self._open = not piece.endswith("\n")

    def end_line(self) -> None:
        """End the answer's line (before other output, and when the answer is complete)."""
        if self._open:
            self.out.write("\n")
            self.out.flush()
            self._open = False

    def start(self, stage: str) -> None:
        self.end_line()
        self.inner.start(stage)

    def end(self, stage: str, seconds: float, detail: str = "") -> None:
        self.end_line()
        self.inner.end(stage, seconds, detail)

    def fail(self, stage: str) -> None:
        self.end_line()
        self.inner.fail(stage)

    def note(self, text: str) -> None:
        self.end_line()
        self.inner.note(text)
