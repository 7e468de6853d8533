"""``AnswerStream``: the answer's text handed to a callback as the verifier decodes it (``SpecRAG.answer(on_text=...)``,
``specrag ask`` on a terminal)."""

from __future__ import annotations

from typing import Callable


class AnswerStream:
    """Forwards decoded pieces of one answer: leading whitespace dropped and, with ``line``, nothing after the first
    line (the answer the pipeline returns is that first line). ``sent`` is everything forwarded so far."""

    def __init__(self, emit: Callable[[str], None], line: bool) -> None:
        self._emit, self._line = emit, line
        self.sent = ""
        self._closed = False

    def push(self, _row: int, piece: str) -> None:
        """``TextModel.generate_ids``' ``on_text`` callback (one row)."""
        if self._closed:
            return
        if not self.sent:
            piece = piece.lstrip()
        if self._line and "\n" in piece:
            piece, self._closed = piece.split("\n", 1)[0], True
        if piece:
            self.sent += piece
            self._emit(piece)
