"""Incremental detokenization for streaming: each new token decodes a short window, not the whole output.

After vLLM's offsets: ``prefix_offset..read_offset`` is a window of already-emitted tokens kept as context
(SentencePiece drops a leading space at the start of a decode and byte-level BPE needs neighbours to form
characters); the new text is ``decode(ids[prefix:]) - decode(ids[prefix:read])``. A piece that ends in an
incomplete UTF-8 sequence (U+FFFD) is held back until the bytes that complete it arrive.
"""

from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Text of a growing token list, in O(window) work per token."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0
        self._read = 0

    def push(self, token: int) -> str:
        """Add one token; returns the text it completes (possibly empty while bytes are pending)."""
        self.ids.append(int(token))
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        new = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += new
        return new

    def flush(self) -> str:
        """The rest of the text once generation ended (held-back bytes decode as they are)."""
        full = self._decode(self.ids)
        rest = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += rest
        return rest
