"""Text for the report: table cells and tables, prose wrapping, and the number formats claims share."""

from __future__ import annotations

import textwrap
from typing import Any, Callable, Sequence

DASH = "–"


def fmt(value: Any, spec: str | Callable[[Any], str] = "{}") -> str:
    """One table cell: ``spec`` is a str.format pattern or a function; None (not recorded) is a dash."""
    if value is None:
        return DASH
    if callable(spec):
        return spec(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return spec.format(value)


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def wrap(lines: Sequence[str], width: int = 120) -> list[str]:
    """Prose lines filled to ``width`` (tables, headings and comments stay one line each)."""
    out: list[str] = []
    for line in lines:
        if not line or line.startswith(("|", "#", "<!--")):
            out.append(line)
        else:
            out += textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)
    return out


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def pct(x: float) -> str:
    return f"{x:.1%}"


def secs(x: float) -> str:
    return f"{x:.2f} s"


def points(x: float) -> str:
    """Points one question is worth: "1 point", "3.3 points"."""
    text = f"{x:.1f}".removesuffix(".0")
    return f"{text} point" + ("" if text == "1" else "s")
