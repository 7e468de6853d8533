"""The declarative specs of benchmarks/claims.py: sections, claims, and the tables of a claim's figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from benchmarks.report_source import Source, get
from benchmarks.report_text import fmt, table


@dataclass(frozen=True)
class Figures:
    """A two-column table of single figures: (label, path, format)."""

    rows: tuple[tuple[str, str, Any], ...]
    caption: str = ""

    def render(self, src: Source, name: str) -> list[str]:
        data, where = src.json(name), src.shown(name)
        body = [(label, fmt(get(data, path, where), spec)) for label, path, spec in self.rows]
        return _captioned(self.caption, table(("figure", "value"), body))


@dataclass(frozen=True)
class Rows:
    """One row per entry of the dict or list at ``over``: the key (dicts) then ``cols`` (header, path, format)
    read inside the entry (an empty path: the entry itself); ``keys`` picks and orders a dict's entries (each one
    required), else every entry is a row (entries that are not dicts skipped when every column reads inside one)."""

    over: str
    cols: tuple[tuple[str, str, Any], ...]
    key: str | None = ""
    keys: tuple[str, ...] = ()
    caption: str = ""
    when: Callable[[Any], bool] | None = None  # keeps an entry (after ``keys``)

    def render(self, src: Source, name: str) -> list[str]:
        data, where = src.json(name), src.shown(name)
        entries = get(data, self.over, where)
        if isinstance(entries, dict):
            items = [(k, get(entries, k, f"{where}: {self.over}")) for k in self.keys] or list(entries.items())
            if not self.keys and all(path for _, path, _ in self.cols):  # entries to read into: only dicts
                items = [(k, e) for k, e in items if isinstance(e, dict)]
        else:
            items = [(str(i), e) for i, e in enumerate(entries)]
        if self.when is not None:
            items = [(k, e) for k, e in items if self.when(e)]
        header = ([self.key] if self.key is not None else []) + [c[0] for c in self.cols]
        body = []
        for k, entry in items:
            at = f"{where}: {self.over}/{k}"
            row = [fmt(get(entry, path, at), spec) for _, path, spec in self.cols]
            body.append(([k] if self.key is not None else []) + row)
        return _captioned(self.caption, table(header, body))


@dataclass(frozen=True)
class Custom:
    """Lines from a function of (source, file name)."""

    fn: Callable[[Source, str], list[str]]

    def render(self, src: Source, name: str) -> list[str]:
        return self.fn(src, name)


def _captioned(caption: str, lines: list[str]) -> list[str]:
    return ([caption, ""] if caption else []) + lines


@dataclass(frozen=True)
class Claim:
    """One result file and the claim it backs: its section in docs/results.md."""

    file: str  # under benchmarks/results; a folder is an eval run (its results.json)
    title: str
    backs: str  # what the figures show and where it is claimed
    tables: tuple = ()
    eval_run: bool = False  # render the generic table of an eval run (methods, split, config)
    extra_files: tuple[str, ...] = field(default=())  # further files of the same claim (listed, not rendered)


@dataclass(frozen=True)
class Section:
    title: str
    intro: str
    claims: tuple[Claim, ...]
