"""The paper's table, a 3-question slice."""

from __future__ import annotations

from benchmarks.report_specs import Claim, Rows, Section
from benchmarks.report_text import pct, secs

_TASKS = ("musique", "triviaqa")

SUITE = Section(
    "The paper's table, a 3-question slice",
    'docs/usage.md "The paper\'s Table 1 in one command": `eval --suite` over the dev rows written as Self-RAG '
    "and MuSiQue files. Three questions say nothing about accuracy; the run shows one command reading both "
    "formats with each task's settings (a shared machine, load average 6-9).",
    (
        Claim(
            "suite_dev3/table.json",
            "Accuracy and latency per task",
            "Standard RAG, the cascade and drafter_only per file.",
            tuple(
                Rows("rows", tuple((task, f"{task}/{figure}", spec) for task in _TASKS), key=label)
                for label, figure, spec in (("mean latency", "latency_s", secs), ("accuracy", "accuracy", pct))
            ),
            extra_files=("suite_dev3/table.md", "suite_dev3/musique", "suite_dev3/triviaqa"),
        ),
    ),
)
