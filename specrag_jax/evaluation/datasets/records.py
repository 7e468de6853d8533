"""Raw records of an evaluation file, JSON lines or one JSON array, each with the line it starts on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval.corpus import iter_json_lines


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecRagError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecRagError(f"{path} is not UTF-8 text (invalid byte on line {line}); convert it to UTF-8") from None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _iter_array(text: str, path: Path) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array, each with the (1-based) line it starts on."""
    decoder = json.JSONDecoder()
    i, line, seen = _skip_space(text, text.index("[") + 1), 1, text.index("[")
    if i < len(text) and text[i] == "]":
        return
    while True:
        line += text.count("\n", seen, i)
        seen = i
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise SpecRagError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg})") from None
        yield line, obj
        i = _skip_space(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_space(text, i + 1)
            continue
        if i < len(text) and text[i] == "]":
            i = _skip_space(text, i + 1)
            if i == len(text):
                return
            problem = "extra data after the array"
        else:
            problem = "expected ',' or the array's closing ']'"
        raise SpecRagError(f"{path}, line {text.count(chr(10), 0, i) + 1}: not valid JSON ({problem})")


def iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each row of a JSON-lines file or of a file holding one JSON array."""
    text = _text(path)
    if text.lstrip().startswith("["):
        yield from _iter_array(text, path)
    else:
        yield from iter_json_lines(path)
