"""`specrag eval --suite DIR` (or repeated ``--data``): every evaluation file of a folder, one task each, run with
the same models, and the per-file results that ``suite_table`` turns into Table 1.

A suite file is any ``*.jsonl`` / ``*.json`` directly in DIR (sorted by name; other files are ignored). Each is read
with ``datasets.load_rows`` (format and task inferred from its first row unless ``--format`` / ``--task`` name them,
bad rows named by file, line and field) before any model loads, so a bad file fails at once. Each file runs with its
task's paper settings (``tasks.task_defaults``: n_docs, m, k) unless the command line gives them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.datasets import Dataset, load_rows, task_defaults
from specrag_jax.evaluation.run import evaluate
from specrag_jax.pipeline.specrag import SpecRAG

SUFFIXES = (".jsonl", ".json")
SETTINGS = ("n_docs", "m", "k")  # the per-task settings (task_defaults) the command line may fix for every file


@dataclasses.dataclass
class SuiteFile:
    """One evaluation file of the suite: its table column, what was read, and the rows to evaluate."""

    path: Path
    column: str
    data: Dataset
    rows: list[dict]


def suite_paths(suite_dir: str | None, data: Sequence[str] = ()) -> list[Path]:
    """The files of ``suite_dir`` (``*.jsonl`` / ``*.json``, sorted) followed by the ``--data`` files."""
    paths: list[Path] = []
    if suite_dir is not None:
        root = Path(suite_dir)
        if not root.is_dir():
            raise SpecRagError(f"--suite {suite_dir}: not a folder")
        paths = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))
        if not paths:
            raise SpecRagError(f"--suite {suite_dir}: no evaluation files (*.jsonl or *.json) in the folder")
    paths += [Path(p) for p in data]
    if len(set(paths)) != len(paths):
        raise SpecRagError(f"{next(p for p in paths if paths.count(p) > 1)}: the same file is given twice")
    return paths


def column_name(data: Dataset, path: Path, taken: set[str]) -> str:
    """A file's column: its task (the format for RetrievalQA without one), ``task:file-stem`` when two files share
    it."""
    name = data.task or data.format
    return name if name not in taken else f"{name}:{path.stem}"


def load_suite(
    paths: Sequence[Path],
    fmt: str | None,
    task: str | None,
    pick: Callable[[list[dict], Path], list[dict]],
    stop: int | None = None,
) -> list[SuiteFile]:
    """Read every file (``stop``: rows read at most per file) and ``pick`` the rows to evaluate (split, offset,
    limit); one-line errors name the file."""
    files: list[SuiteFile] = []
    taken: set[str] = set()
    for path in paths:
        data = load_rows(path, fmt, task, stop)
        column = column_name(data, path, taken)
        taken.add(column)
        files.append(SuiteFile(path, column, data, pick(data.rows, path)))
    return files


def file_settings(task: str | None, given: dict[str, int | None]) -> dict[str, int]:
    """``n_docs``, ``m``, ``k`` for one file: the command line's where given, else the task's paper defaults."""
    defaults = task_defaults(task)
    return {name: defaults[name] if given.get(name) is None else int(given[name]) for name in SETTINGS}


def run_suite(
    rag: SpecRAG,
    files: Sequence[SuiteFile],
    methods: Sequence[str],
    given: dict[str, int | None],
    describe: Callable[[SuiteFile], dict[str, Any]],
    out: Path | None = None,
    progress: bool = True,
    concurrency: int = 1,
) -> dict[str, dict[str, Any]]:
    """Evaluate every file with its settings; returns ``{column: results}`` (the single-file eval JSON, with
    ``config`` from ``describe``). With ``out``, each file's ``results.json`` and ``predictions.jsonl`` are
    written to ``out/<column>/`` as soon as it ends."""
    base = rag.config
    per_file: dict[str, dict[str, Any]] = {}
    try:
        for f in files:
            rag.config = dataclasses.replace(base, **file_settings(f.data.task, given))
            rag.config.check()
            results = evaluate(rag, f.rows, methods, progress=progress, concurrency=concurrency)
            predictions = results.pop("predictions")
            results["config"] = describe(f)
            per_file[f.column] = results
            if out is not None:
                write_results(out / f.column.replace(":", "_"), results, predictions)
    finally:
        rag.config = base
    return per_file


def write_results(folder: Path, results: dict[str, Any], predictions: Sequence[dict]) -> None:
    """``results.json`` and ``predictions.jsonl`` of one evaluation in ``folder`` (the single-file eval's files)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=2))
    (folder / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in predictions))
