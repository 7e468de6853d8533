"""RetrievalQA dev rows written as Self-RAG and MuSiQue files (benchmarks/convert_formats.py) read back to the
same questions, gold answers and passages. The dev file is read at test time, never copied into the repo."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.convert_formats import main as convert_main
from benchmarks.convert_formats import write_musique, write_selfrag
from specrag_jax.evaluation.datasets import load_rows
from specrag_jax.retrieval import docs_from_context

DEV = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "retrievalqa_dev.jsonl"


@pytest.fixture(scope="module")
def dev_rows() -> list[dict]:
    if not DEV.is_file():
        pytest.skip(f"{DEV} is absent")
    rows = load_rows(DEV).rows
    picked = rows[::20]  # one row of each data source (the file is sorted by source)
    picked.append(next(r for r in rows if any(isinstance(p, str) for p in r["context"])))  # plain-string passages
    picked.append(next(r for r in rows if any(isinstance(p, dict) and "text" not in p for p in r["context"])))
    return picked


def _view(row: dict) -> tuple:
    """What the engine sees of a row: question, gold answers, passages as (title, text)."""
    return (
        row["question"],
        list(row["ground_truth"]),
        [(d["title"], d["text"]) for d in docs_from_context(row["context"])],
    )


@pytest.mark.parametrize(
    "writer, fmt, task, array",
    [
        (write_selfrag, "selfrag", "triviaqa", False),
        (write_selfrag, "selfrag", "triviaqa", True),
        (write_musique, "musique", "musique", False),
        (write_musique, "musique", "musique", True),
    ],
)
def test_converted_rows_read_back_equal(tmp_path, dev_rows, writer, fmt, task, array):
    path = tmp_path / ("rows.json" if array else "rows.jsonl")
    writer(dev_rows, path, array=array)
    data = load_rows(path)
    assert (data.format, data.task) == (fmt, task)
    assert [_view(r) for r in data.rows] == [_view(r) for r in dev_rows]
    assert [r["question_id"] for r in data.rows] == [r["question_id"] for r in dev_rows]


def test_convert_script(tmp_path, capsys):
    if not DEV.is_file():
        pytest.skip(f"{DEV} is absent")
    out = tmp_path / "dev_musique.jsonl"
    assert convert_main(["--data", str(DEV), "--to", "musique", "--out", str(out), "--limit", "3"]) == 0
    assert [_view(r) for r in load_rows(out).rows] == [_view(r) for r in load_rows(DEV, limit=3).rows]
    assert (
        convert_main(["--data", str(DEV), "--to", "selfrag", "--out", str(out), "--limit", "3", "--every", "34"]) == 0
    )
    assert [_view(r) for r in load_rows(out).rows] == [_view(r) for r in load_rows(DEV).rows[::34][:3]]
    with pytest.raises(SystemExit):
        convert_main(["--data", str(DEV), "--to", "selfrag", "--out", str(out), "--every", "0"])
