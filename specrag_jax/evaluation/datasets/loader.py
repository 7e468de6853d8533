"""``load_rows``: an evaluation file in any supported format -> internal rows, plus the format and task used.

The format is detected from the fields of the first row unless named: ``paragraphs`` -> musique,
``ground_truth`` -> retrievalqa, Self-RAG's fields (``answers``, ``possible_answers``, ``ctxs``, ``choices``,
...) -> selfrag. The task is inferred from the format and fields unless named (RetrievalQA has none: its rows
stay exactly as in the file and are scored by substring match).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.datasets import musique, rqa_reader, selfrag
from specrag_jax.evaluation.datasets.records import iter_records
from specrag_jax.evaluation.datasets.tasks import get_task
from specrag_jax.pipeline.closed_set import closed_set

Reader = Callable[[dict, str, str | None], dict]
READERS: dict[str, Reader] = {
    "selfrag": selfrag.read_selfrag,
    "musique": musique.read_musique,
    "retrievalqa": rqa_reader.read_retrievalqa,
}
FORMATS = tuple(READERS)


@dataclass
class Dataset:
    rows: list[dict]
    format: str
    task: str | None  # None: RetrievalQA without --task (open-ended)


def detect_format(obj: dict) -> str | None:
    """The format a first row's fields point to, or None."""
    if any(f in obj for f in musique.FIELDS):
        return "musique"
    if any(f in obj for f in rqa_reader.FIELDS):
        return "retrievalqa"
    if any(f in obj for f in selfrag.FIELDS):
        return "selfrag"
    return None


def _default_task(fmt: str, obj: dict) -> str | None:
    if fmt == "selfrag":
        return selfrag.infer_task(obj)
    return "musique" if fmt == "musique" else None


def check_task(row: dict, task: str, where: str) -> None:
    """A closed-set task needs rows it can score: arc_c its choices, pubhealth a true/false label."""
    if task == "arc_c" and not row.get("choices"):
        raise SpecRagError(
            f"{where}: 'choices' is missing: --task arc_c needs multiple-choice rows "
            "(Self-RAG 'choices' and 'answerKey')"
        )
    closed_set(task, row.get("choices"), where)  # every choice has a label and a text (the prompts show them)
    if task == "pubhealth" and not all(str(g).strip().lower() in ("true", "false") for g in row["ground_truth"]):
        raise SpecRagError(
            f"{where}: 'ground_truth' must be true or false for --task pubhealth (got {row['ground_truth'][:3]!r})"
        )


def load_rows(path: str | Path, fmt: str | None = None, task: str | None = None, limit: int | None = None) -> Dataset:
    """At most ``limit`` rows of ``path`` (JSON lines or one JSON array) in the internal shape.

    ``fmt``: selfrag, musique, retrievalqa, or None / "auto" (from the first row's fields); ``task``: one of
    ``tasks.TASKS`` or None (from the format and the first row's fields).
    """
    fmt = None if fmt in (None, "auto") else fmt
    if fmt is not None and fmt not in READERS:
        raise SpecRagError(f"unknown format {fmt!r}; choose one of auto, {', '.join(FORMATS)}")
    get_task(task)
    p = Path(path)
    if not p.is_file():
        raise SpecRagError(f"evaluation data file does not exist: {path}")
    rows: list[dict] = []
    for n, obj in iter_records(p):
        where = f"{path}, line {n}"
        if not isinstance(obj, dict):
            raise SpecRagError(f"{where}: a row must be a JSON object (got {type(obj).__name__})")
        if not rows:
            fmt = fmt or detect_format(obj)
            if fmt is None:
                raise SpecRagError(
                    f"{where}: cannot tell the format from the first row's fields "
                    f"({', '.join(sorted(obj)[:8])}); pass --format {'|'.join(FORMATS)}"
                )
            task = task or _default_task(fmt, obj)
        row = READERS[fmt](obj, where, task)
        if task is not None:
            check_task(row, task, where)
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise SpecRagError(f"evaluation data file has no questions: {path}")
    return Dataset(rows, fmt, task)
