"""Documents: ``{"id", "title", "text"}`` dicts from JSON lines, a folder of text files, or question contexts.

- ``load_corpus(path)``: a JSON-lines file (one object or plain string per line) or a folder of ``.txt`` /
  ``.md`` files (id = path relative to the folder, title = first line when the file has more, else stem).
- ``default_corpus()``: CPython's own help topics (``pydoc_data.topics``), one document per topic; it ships
  with Python, so ``specrag ask`` has something to retrieve from with no corpus given and no download.
- ``docs_from_context(context)``: passages that arrive with a question (strings, or objects with title
  and/or text and optionally id and score, as in RetrievalQA) -> documents.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from specrag_jax.errors import SpecRagError

Document = dict  # {"id": str, "title": str, "text": str, optional "score": float}

TEXT_SUFFIXES = (".txt", ".md")
_MAX_TITLE_CHARS = 200


def doc_text(doc: Document) -> str:
    """The text an index or an embedding sees: title, newline, body (either may be empty)."""
    title, text = doc.get("title", ""), doc.get("text", "")
    return f"{title}\n{text}" if title and text else (title or text)


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        offset = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, offset) + 1
        raise SpecRagError(
            f"{path} is not UTF-8 text (invalid byte 0x{data[offset]:02x} at byte offset "
            f"{offset}, line {line}); convert it to UTF-8"
        ) from None


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecRagError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return _decode(data, path)


def _make_doc(obj: Any, default_id: str, where: str) -> Document:
    if isinstance(obj, str):
        return {"id": default_id, "title": "", "text": obj}
    if not isinstance(obj, dict):
        raise SpecRagError(f"{where}: a document must be a string or an object, got {type(obj).__name__}")
    title, text = obj.get("title") or "", obj.get("text")
    if text is None:
        text = obj.get("contents") or ""
    if not isinstance(title, str) or not isinstance(text, str):
        raise SpecRagError(f"{where}: 'title' and 'text' must be strings")
    doc_id = obj.get("id", default_id)
    doc: Document = {"id": str(doc_id) if doc_id is not None else default_id, "title": title, "text": text}
    if obj.get("score") is not None:
        try:
            doc["score"] = float(obj["score"])
        except (TypeError, ValueError):
            raise SpecRagError(f"{where}: 'score' must be a number, got {obj['score']!r}") from None
    return doc


def _check(docs: list[Document], source: str) -> list[Document]:
    if not docs:
        raise SpecRagError(f"corpus {source} holds no documents")
    seen: dict[str, int] = {}
    for i, d in enumerate(docs):
        if d["id"] in seen:
            raise SpecRagError(
                f"corpus {source}: duplicate document id {d['id']!r} (documents {seen[d['id']]} and {i})"
            )
        seen[d["id"]] = i
    return docs


def iter_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line; one-line errors for bad UTF-8 or bad JSON."""
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecRagError(f"{path}, line {lineno}: not valid JSON ({exc.msg})") from None
        yield lineno, obj


def read_jsonl(path: Path, *, keep_empty: bool = False) -> list[Document]:
    """Documents from a JSON-lines file; blank lines (and, unless ``keep_empty``, empty documents) skipped.

    A document's id defaults to its line number.
    """
    docs: list[Document] = []
    for lineno, obj in iter_json_lines(path):
        doc = _make_doc(obj, str(lineno), f"{path}, line {lineno}")
        if keep_empty or doc["title"] or doc["text"]:
            docs.append(doc)
    return docs


def _file_doc(path: Path, root: Path) -> Document:
    content = _read_text(path).strip()
    first, _, rest = content.partition("\n")
    heading = first.strip().lstrip("#").strip()
    if rest.strip() and heading and len(heading) <= _MAX_TITLE_CHARS:
        title, text = heading, rest.strip()
    else:
        title, text = path.stem, content
    return {"id": path.relative_to(root).as_posix(), "title": title, "text": text}


def read_folder(root: Path) -> list[Document]:
    """Documents from every .txt / .md file under ``root`` (hidden entries skipped), in path order."""
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files += [Path(dirpath) / f for f in filenames if not f.startswith(".") and f.lower().endswith(TEXT_SUFFIXES)]
    docs = [_file_doc(p, root) for p in sorted(files, key=lambda p: p.relative_to(root).as_posix())]
    return [d for d in docs if d["text"] or d["title"]]


def load_corpus(path: str | os.PathLike) -> list[Document]:
    """Documents from a JSON-lines file or a folder of .txt/.md files; errors name the file (and line)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return _check(read_folder(p), f"{p} (no non-empty .txt or .md files)")
    if p.is_file():
        if p.suffix.lower() in TEXT_SUFFIXES:
            return _check([_file_doc(p, p.parent)], str(p))
        return _check(read_jsonl(p), str(p))
    raise SpecRagError(f"corpus not found: {p}")


def default_corpus() -> list[Document]:
    """CPython's help topics (``pydoc_data.topics``): one document per topic, title = topic name."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # stripped-down Python builds
        raise SpecRagError(
            "the built-in corpus needs CPython's pydoc_data module, which this Python lacks; "
            "pass a corpus file or folder"
        ) from exc
    docs = [
        {"id": f"pydoc:{name}", "title": name, "text": body.strip()}
        for name, body in sorted(topics.items())
        if body.strip()
    ]
    return _check(docs, "pydoc_data.topics")


def docs_from_context(context: Sequence[str | dict] | Iterable[str | dict]) -> list[Document]:
    """Passages given with a question -> documents (ids ``ctx<i>`` unless given; empty passages dropped).

    A passage is a string or an object with ``title`` and/or ``text`` (and optionally ``id`` and ``score``).
    """
    if isinstance(context, (str, bytes, dict)) or context is None:
        raise SpecRagError("context must be a list of passages (strings or objects with title/text)")
    docs = []
    for i, passage in enumerate(context):
        doc = _make_doc(passage, f"ctx{i}", f"context passage {i}")
        if doc["title"].strip() or doc["text"].strip():
            docs.append(doc)
    if not docs:
        raise SpecRagError("the question's context holds no non-empty passages")
    return docs


def write_jsonl(docs: Sequence[Document], path: Path) -> None:
    """Write documents one JSON object per line (UTF-8)."""
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
