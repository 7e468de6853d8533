"""One corpus from every passage of a RetrievalQA-format file, and recall of a question's own passages.

Passages are identified by text: a passage's key is its ``text`` with runs of whitespace collapsed (its title
when the text is empty). Pooling keeps the first passage of each key (ids ``p0``, ``p1``, ... in file order);
``own_passage_recall`` is the fraction of a question's own passages whose key is among the used documents'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval.corpus import Document, docs_from_context, iter_json_lines, write_jsonl


def passage_key(doc: Document) -> str:
    """The identity of a passage: its whitespace-normalised text (or title when it has no text)."""
    return " ".join((doc.get("text") or doc.get("title") or "").split())


def own_passages(row: dict) -> list[Document]:
    """A question row's own passages (its ``context``) as documents; none when it has no context."""
    context = row.get("context") or []
    if not context:
        return []
    try:
        return docs_from_context(context)
    except SpecRagError:  # a context with no non-empty passage
        return []


def pool_passages(rows: Iterable[dict], exclude: Iterable[dict] = ()) -> list[Document]:
    """Every passage of every row, deduplicated by ``passage_key``, with fresh ids ``p<i>``; a passage that any
    ``exclude`` row also holds is left out (a corpus for training that shares no passage with held-out rows)."""
    seen: set[str] = {passage_key(d) for row in exclude for d in own_passages(row)}
    docs: list[Document] = []
    for row in rows:
        for d in own_passages(row):
            key = passage_key(d)
            if key and key not in seen:
                seen.add(key)
                docs.append({"id": f"p{len(docs)}", "title": d.get("title", ""), "text": d.get("text", "")})
    return docs


def write_pool(rows: Iterable[dict], out: str | Path, exclude: Iterable[dict] = ()) -> int:
    """Write ``pool_passages(rows, exclude)`` to JSON lines ``out``; returns its size."""
    docs = pool_passages(rows, exclude)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(docs, Path(out))
    return len(docs)


def pool_file(data: str | Path, out: str | Path) -> int:
    """Write the pooled corpus of the RetrievalQA-format file ``data`` to JSON lines ``out``; returns its size."""
    return write_pool((obj for _, obj in iter_json_lines(Path(data)) if isinstance(obj, dict)), out)


def own_passage_recall(own: Sequence[Document], used_keys: Iterable[str]) -> float | None:
    """Fraction of the distinct ``own`` passages whose key is in ``used_keys`` (None without own passages)."""
    wanted = {passage_key(d) for d in own} - {""}
    if not wanted:
        return None
    return len(wanted & set(used_keys)) / len(wanted)
