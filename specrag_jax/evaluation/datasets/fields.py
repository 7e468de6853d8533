"""Field checks shared by the readers: each failure is one line naming the file, line and field."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from specrag_jax.errors import SpecRagError


def row_error(where: str, field: str, message: str) -> SpecRagError:
    """``<file>, line <n>: '<field>' <message>`` (``where`` is ``<file>, line <n>``)."""
    return SpecRagError(f"{where}: '{field}' {message}")


def short(value: Any, limit: int = 60) -> str:
    """A value's repr, cut to ``limit`` characters (one line: repr escapes newlines)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_text(obj: dict, names: Sequence[str], where: str) -> str:
    """The first of ``names`` present in ``obj``: a non-empty string."""
    for name in names:
        if name in obj:
            value = obj[name]
            if not isinstance(value, str) or not value.strip():
                raise row_error(where, name, f"must be a non-empty string (got {short(value)})")
            return value
    raise SpecRagError(f"{where}: a row needs " + " or ".join(f"'{n}'" for n in names))


def answer_text(value: Any, field: str, where: str) -> str:
    """A gold answer: a non-empty string (numbers are written as text)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise row_error(where, field, f"must be a non-empty string (got {short(value)})")
    return str(value)


def answer_list(value: Any, field: str, where: str) -> list[str]:
    """A non-empty list of gold answers."""
    if not isinstance(value, list) or not value:
        raise row_error(where, field, f"must be a non-empty list of answers (got {short(value)})")
    return [answer_text(v, f"{field}[{i}]", where) for i, v in enumerate(value)]


def passages(value: Any, field: str, where: str, text_key: str = "text") -> list[dict]:
    """``[{"title", "text"}]`` from a list of objects with a string ``text_key`` (title optional)."""
    if not isinstance(value, list):
        raise row_error(where, field, f"must be a list of passages (got {short(value)})")
    out = []
    for i, p in enumerate(value):
        if not isinstance(p, dict) or not isinstance(p.get(text_key), str):
            raise row_error(where, f"{field}[{i}]", f"needs a string '{text_key}' (got {short(p)})")
        title = p.get("title") or ""
        if not isinstance(title, str):
            raise row_error(where, f"{field}[{i}].title", f"must be a string (got {short(title)})")
        out.append({"title": title, "text": p[text_key]})
    return out


def question_id(obj: dict, source: str, question: str) -> str:
    """The row's own id (``question_id``, ``id`` or ``_id``), else ``<source>_<hash of the question>``: stable
    under reordering, as the held-out split (``evaluation.holdout``) needs."""
    for name in ("question_id", "id", "_id"):
        if obj.get(name) is not None:
            return str(obj[name])
    return f"{source}_{hashlib.sha1(question.encode('utf-8')).hexdigest()[:12]}"
