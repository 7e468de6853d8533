"""Table 1's cells from per-file results: accuracy %, mean latency, reduction vs standard RAG (none without it)."""

from __future__ import annotations

from pathlib import Path

from specrag_jax.evaluation.datasets import Dataset
from specrag_jax.evaluation.suite import SuiteFile, column_name, file_settings
from specrag_jax.evaluation.suite_table import PAPER, build_table, table_markdown


def _results(**methods: tuple[float, float]) -> dict:
    return {
        "methods": {m: {"n": 4, "accuracy": acc, "latency_s": {"mean": lat}} for m, (acc, lat) in methods.items()},
        "config": {"n_docs": 10, "m": 5, "k": 2},
    }


def _file(column: str, task: str | None) -> SuiteFile:
    return SuiteFile(Path(f"{column}.jsonl"), column, Dataset([], "selfrag", task), [{}] * 4)


def test_cells_and_markdown():
    per_file = {
        "popqa": _results(standard=(0.5, 2.0), speculative=(0.75, 1.5)),
        "arc_c": _results(speculative=(0.25, 1.0)),
    }
    files = [_file("popqa", "popqa"), _file("arc_c", "arc_c")]
    table = build_table(
        per_file,
        files,
        ["standard", "speculative"],
        {"drafter": "d", "verifier": "v"},
        {"backend": "gpu", "device_kind": "H200", "device_count": 1, "cpu_count": 16},
    )
    assert table["rows"]["speculative"]["popqa"] == {
        "accuracy": 75.0,
        "latency_s": 1.5,
        "latency_reduction": 0.25,
        "n": 4,
    }
    assert table["rows"]["speculative"]["arc_c"]["latency_reduction"] is None  # no standard RAG run on that file
    assert table["rows"]["standard"]["arc_c"] is None
    assert table["files"]["arc_c"] == {
        "path": "arc_c.jsonl",
        "format": "selfrag",
        "task": "arc_c",
        "n": 4,
        "n_docs": 10,
        "m": 5,
        "k": 2,
    }
    assert table["paper"]["drafter_only"]["accuracy"] == PAPER["drafter_only"]
    md = table_markdown(table)
    assert "| speculative | 75.0 · 1.50 s (+25%) | 25.0 · 1.00 s |" in md
    assert "| standard | 50.0 · 2.00 s (+0%) | - |" in md
    assert "1 x H200 (gpu), 16 CPUs" in md and "| 73.91 | - | 53.68 | - | - |" in md


def test_columns_and_settings():
    data = Dataset([], "retrievalqa", None)
    assert column_name(data, Path("dev.jsonl"), set()) == "retrievalqa"
    assert column_name(Dataset([], "selfrag", "popqa"), Path("b.jsonl"), {"popqa"}) == "popqa:b"
    assert file_settings("musique", {"n_docs": None, "m": None, "k": None}) == {"n_docs": 15, "m": 10, "k": 6}
    assert file_settings("musique", {"n_docs": 4, "m": None, "k": 1}) == {"n_docs": 4, "m": 10, "k": 1}
    assert file_settings(None, {}) == {"n_docs": 10, "m": 5, "k": 2}
