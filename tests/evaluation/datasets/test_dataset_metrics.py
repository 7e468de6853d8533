"""Task metrics (substring match; exact ARC / PubHealth labels), the paper's per-task defaults, and how
`specrag eval` records --format / --task (models replaced by stubs: no model is loaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrag_jax.cli import main
from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation import run as evaluation
from specrag_jax.evaluation import suite  # noqa: F401  imported here, it binds the real evaluate
from specrag_jax.evaluation.datasets import TASKS, score_answer, task_defaults
from specrag_jax.evaluation.datasets.metrics import contains_answer
from specrag_jax.evaluation.run import is_correct, load_questions

MINI = Path(__file__).resolve().parents[2] / "pipeline" / "data" / "mini_eval.jsonl"
CHOICES = [
    {"label": "A", "text": "oxygen"},
    {"label": "B", "text": "carbon dioxide"},
    {"label": "C", "text": "helium"},
    {"label": "D", "text": "neon"},
]


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("Paris", ["Paris"]),
        ("it is paris, France", ["paris"]),
        ("Lyon", ["Paris"]),
        ("", ["Paris"]),
        ("anything", ["", "  "]),
        ("The year 1961.", [1961]),
        ("PARIS", [" paris "]),
        ("x", []),
    ],
)
def test_open_tasks_score_exactly_like_is_correct(answer, gold):
    expected = is_correct(answer, gold)
    assert contains_answer(answer, gold) == expected
    for task in (None, "popqa", "triviaqa", "musique"):
        row = {"ground_truth": gold} if task is None else {"ground_truth": gold, "task": task}
        assert score_answer(row, answer) == expected


def test_retrievalqa_rows_score_like_is_correct():
    for row in load_questions(MINI):
        for answer in (row["ground_truth"][0], row["ground_truth"][0].upper() + " indeed", "no idea", ""):
            assert score_answer(row, answer) == is_correct(answer, row["ground_truth"])


@pytest.mark.parametrize(
    "answer, ok",
    [
        ("B", True),
        ("b", True),
        (" (B) ", True),
        ("B.", True),
        ("B)", True),
        ("B) carbon dioxide", True),
        ("(B) Carbon  dioxide.", True),
        ("B: carbon dioxide", True),
        ("carbon dioxide", True),
        ("Carbon Dioxide.", True),
        ("The answer is B", True),
        ("Answer: carbon dioxide", True),
        ("A", False),
        ("C) helium", False),
        ("B) helium", False),
        ("oxygen", False),
        ("Bees", False),
        ("carbon dioxide and oxygen", False),
        ("", False),
        ("A or B", False),
    ],
)
def test_arc_scores_the_exact_label_or_choice_text(answer, ok):
    row = {"task": "arc_c", "ground_truth": ["B"], "choices": CHOICES}
    assert score_answer(row, answer) is ok


@pytest.mark.parametrize(
    "answer, gold, ok",
    [
        ("true", "true", True),
        (" True. ", "true", True),
        ("TRUE", "true", True),
        ("SUPPORTS", "true", True),
        ("false", "false", True),
        ("REFUTES", "false", True),
        ("False", "true", False),
        ("true", "false", False),
        ("true or false", "true", False),
        ("It is true", "true", False),
        ("", "false", False),
    ],
)
def test_pubhealth_scores_true_false(answer, gold, ok):
    assert score_answer({"task": "pubhealth", "ground_truth": [gold]}, answer) is ok


def test_paper_defaults_per_task():
    assert set(TASKS) == {"popqa", "triviaqa", "musique", "pubhealth", "arc_c"}
    assert {t.name for t in TASKS.values() if t.closed} == {"pubhealth", "arc_c"}
    assert task_defaults("musique") == {"n_docs": 15, "m": 10, "k": 6}
    for name in ("popqa", "triviaqa", "pubhealth", "arc_c", None):
        assert task_defaults(name) == {"n_docs": 10, "m": 5, "k": 2}
    with pytest.raises(SpecRagError, match="unknown task 'nq'"):
        task_defaults("nq")


class _StubRag:
    drafter_adapter = None
    verifier_chat = False


@pytest.fixture
def stub_eval(monkeypatch):
    """`specrag eval` with model loading and evaluation replaced: returns the rows evaluate() received."""
    seen: dict = {}

    def evaluate(rag, rows, methods, progress=True, corpus=None, concurrency=1):
        seen["rows"] = rows
        return {"methods": {}, "predictions": []}

    monkeypatch.setattr("specrag_jax.cli.build_rag", lambda args, corpus, config: _StubRag())
    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    return seen


def _run(capsys, *args: str) -> dict:
    assert main(["eval", *args, "--json", "-q"]) == 0
    return json.loads(capsys.readouterr().out)["config"]


def test_eval_config_records_format_task_and_task_defaults(capsys, tmp_path, stub_eval):
    config = _run(capsys, "--data", str(MINI))
    assert (config["format"], config["task"]) == ("retrievalqa", None)
    assert (config["n_docs"], config["m"], config["k"]) == (10, 5, 2)
    assert stub_eval["rows"] == load_questions(MINI)

    path = tmp_path / "musique.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "2hop__1",
                "question": "Who?",
                "answer": "Ada",
                "paragraphs": [{"title": "T", "paragraph_text": "Ada did.", "is_supporting": True}],
            }
        )
    )
    config = _run(capsys, "--data", str(path))
    assert (config["format"], config["task"], config["n_docs"], config["m"], config["k"]) == (
        "musique",
        "musique",
        15,
        10,
        6,
    )
    assert stub_eval["rows"][0]["context"] == [{"title": "T", "text": "Ada did."}]
    config = _run(capsys, "--data", str(path), "--format", "musique", "--m", "3", "--n-docs", "4")
    assert (config["n_docs"], config["m"], config["k"]) == (4, 3, 6)

    config = _run(capsys, "--data", str(MINI), "--task", "popqa")
    assert (config["format"], config["task"]) == ("retrievalqa", "popqa")
    assert all(r["task"] == "popqa" for r in stub_eval["rows"])


def test_eval_bad_rows_are_one_line_errors(capsys, tmp_path, stub_eval):
    path = tmp_path / "arc.jsonl"
    path.write_text(
        json.dumps({"question": "Which?", "answerKey": "E", "choices": {"label": ["A", "B"], "text": ["x", "y"]}})
        + "\n"
    )
    assert main(["eval", "--data", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}, line 1: 'answerKey' must be one of the choices' labels" in err[0]
    assert main(["eval", "--data", str(MINI), "--format", "musique"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 1: 'answer' is missing" in err[0]
    assert main(["eval", "--data", str(MINI), "--task", "nq"]) == 2  # one line, not argparse's usage text
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["specrag: error: unknown task 'nq'; choose one of popqa, triviaqa, musique, pubhealth, arc_c"]
