"""Self-RAG, MuSiQue and RetrievalQA readers: every field variant, format detection and one-line row errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.datasets import detect_format, load_rows
from specrag_jax.evaluation.run import load_questions

MINI = Path(__file__).resolve().parents[2] / "pipeline" / "data" / "mini_eval.jsonl"


def _write(tmp_path: Path, rows: list, name: str = "data.jsonl", array: bool = False) -> Path:
    path = tmp_path / name
    text = json.dumps(rows, indent=2) if array else "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


POPQA = {
    "id": 4222,
    "question": "What is George Rankin's occupation?",
    "possible_answers": '["politician", "political leader"]',
    "ctxs": [
        {"id": "1", "title": "George Rankin", "text": "He was a politician.", "score": 1.5, "hasanswer": True},
        {"title": "Rankin", "text": "A surname."},
    ],
}


def test_selfrag_popqa_possible_answers_and_ctxs(tmp_path):
    data = load_rows(_write(tmp_path, [POPQA]))
    assert (data.format, data.task) == ("selfrag", "popqa")
    assert data.rows == [
        {
            "question": POPQA["question"],
            "ground_truth": ["politician", "political leader"],
            "context": [
                {"title": "George Rankin", "text": "He was a politician."},
                {"title": "Rankin", "text": "A surname."},
            ],
            "data_source": "popqa",
            "question_id": "4222",
            "task": "popqa",
        }
    ]


@pytest.mark.parametrize(
    "row, gold, context",
    [
        ({"question": "Capital of France?", "answers": ["Paris", "Paris, France"]}, ["Paris", "Paris, France"], []),
        ({"instruction": "Capital of France?", "answer": "Paris"}, ["Paris"], []),
        (
            {
                "question": "Capital of France?",
                "answer": "Paris",
                "top_contexts": [{"title": "France", "text": "Paris."}],
            },
            ["Paris"],
            [{"title": "France", "text": "Paris."}],
        ),
        (
            {"question": "Capital of France?", "answers": ["Paris"], "ctxs": [{"text": "No title here."}]},
            ["Paris"],
            [{"title": "", "text": "No title here."}],
        ),
    ],
)
def test_selfrag_open_variants(tmp_path, row, gold, context):
    data = load_rows(_write(tmp_path, [row]))
    assert (data.format, data.task) == ("selfrag", "triviaqa")
    [got] = data.rows
    assert got["question"] == "Capital of France?" and got["ground_truth"] == gold and got["context"] == context
    assert got["data_source"] == "triviaqa" and got["question_id"].startswith("triviaqa_") and "choices" not in got


@pytest.mark.parametrize(
    "row, gold",
    [
        ({"question": "Vitamin C cures colds.", "label": "FALSE"}, ["false"]),
        ({"claim": "Exercise helps sleep.", "label": True}, ["true"]),
        ({"question": "Exercise helps sleep.", "answers": ["true"]}, ["true"]),
        ({"question": "Exercise helps sleep.", "answer": "False"}, ["false"]),
    ],
)
def test_selfrag_pubhealth_label_variants(tmp_path, row, gold):
    data = load_rows(_write(tmp_path, [row]))
    assert (data.format, data.task) == ("selfrag", "pubhealth")
    assert data.rows[0]["ground_truth"] == gold and data.rows[0]["task"] == "pubhealth"


ARC = {
    "id": "Mercury_7175875",
    "question": "Which gas do plants take in?",
    "answerKey": "B",
    "choices": {"label": ["A", "B", "C", "D"], "text": ["oxygen", "carbon dioxide", "helium", "neon"]},
}


def test_selfrag_arc_choices(tmp_path):
    data = load_rows(_write(tmp_path, [ARC]))
    assert (data.format, data.task) == ("selfrag", "arc_c")
    row = data.rows[0]
    assert row["ground_truth"] == ["B"] and row["question_id"] == "Mercury_7175875" and row["context"] == []
    assert row["choices"] == [
        {"label": "A", "text": "oxygen"},
        {"label": "B", "text": "carbon dioxide"},
        {"label": "C", "text": "helium"},
        {"label": "D", "text": "neon"},
    ]


def test_selfrag_json_array_file(tmp_path):
    data = load_rows(_write(tmp_path, [POPQA, {**POPQA, "id": 5}], name="popqa.json", array=True))
    assert [r["question_id"] for r in data.rows] == ["4222", "5"] and data.task == "popqa"
    assert (
        load_rows(_write(tmp_path, [], name="empty.json", array=True).parent / "popqa.json", limit=1).rows
        == data.rows[:1]
    )


MUSIQUE = {
    "id": "2hop__1_2",
    "question": "Who founded the company that makes X?",
    "answer": "Ada",
    "answer_aliases": ["Ada L."],
    "answerable": True,
    "paragraphs": [
        {"idx": 0, "title": "X", "paragraph_text": "X is made by Y.", "is_supporting": True},
        {"idx": 1, "title": "Z", "paragraph_text": "Unrelated.", "is_supporting": False},
        {"idx": 2, "title": "Y", "paragraph_text": "Y was founded by Ada.", "is_supporting": True},
    ],
}


def test_musique_paragraphs_in_order(tmp_path):
    data = load_rows(_write(tmp_path, [MUSIQUE, {**MUSIQUE, "answer_aliases": []}]))
    assert (data.format, data.task) == ("musique", "musique")
    row = data.rows[0]
    assert row["ground_truth"] == ["Ada", "Ada L."] and data.rows[1]["ground_truth"] == ["Ada"]
    assert row["context"] == [
        {"title": "X", "text": "X is made by Y."},
        {"title": "Z", "text": "Unrelated."},
        {"title": "Y", "text": "Y was founded by Ada."},
    ]
    assert (row["data_source"], row["question_id"], row["task"]) == ("musique", "2hop__1_2", "musique")


def test_retrievalqa_rows_are_todays_rows():
    for limit in (None, 1):
        data = load_rows(MINI, limit=limit)
        assert (data.format, data.task) == ("retrievalqa", None)
        assert data.rows == load_questions(MINI, limit)
    tagged = load_rows(MINI, "retrievalqa", "popqa")
    assert [{**r, "task": "popqa"} for r in load_questions(MINI)] == tagged.rows and tagged.task == "popqa"


@pytest.mark.parametrize(
    "row, fmt",
    [
        (POPQA, "selfrag"),
        (ARC, "selfrag"),
        ({"question": "q", "answers": ["a"]}, "selfrag"),
        ({"instruction": "q", "answer": "a"}, "selfrag"),
        ({"question": "q", "label": "true"}, "selfrag"),
        (MUSIQUE, "musique"),
        ({"question": "q", "ground_truth": ["a"], "context": []}, "retrievalqa"),
        ({"question": "q"}, None),
        ({"prompt": "q", "output": "a"}, None),
    ],
)
def test_detect_format(row, fmt):
    assert detect_format(row) == fmt


def test_named_format_and_task_override_detection(tmp_path):
    path = _write(tmp_path, [{"question": "Capital of France?", "answers": ["Paris"]}])
    assert load_rows(path, "selfrag", "popqa").rows[0]["task"] == "popqa"
    assert load_rows(path, "auto").task == "triviaqa"


def _error(path: Path, fmt: str | None = None, task: str | None = None) -> str:
    with pytest.raises(SpecRagError) as info:
        load_rows(path, fmt, task)
    message = str(info.value)
    assert "\n" not in message
    return message


GOOD = {"question": "Capital of France?", "answers": ["Paris"]}


@pytest.mark.parametrize(
    "bad, fmt, task, field",
    [
        ({"answers": ["Paris"]}, None, None, "'question'"),
        ({"question": "", "answers": ["Paris"]}, None, None, "'question' must be a non-empty string"),
        ({"question": "q?"}, "selfrag", None, "'answers' is missing"),
        ({"question": "q?", "answers": []}, None, None, "'answers' must be a non-empty list"),
        ({"question": "q?", "answers": ["ok", None]}, None, None, "'answers[1]' must be a non-empty string"),
        ({"question": "q?", "possible_answers": '["a", "b"'}, None, "popqa", "'possible_answers' must be a JSON"),
        ({"question": "q?", "possible_answers": ["a"]}, None, "popqa", "'possible_answers' must be a JSON"),
        ({"question": "q?", "possible_answers": '"a"'}, None, "popqa", "'possible_answers' must be a JSON"),
        (
            {"question": "q?", "answers": ["a"], "ctxs": [{"title": "t", "text": "x"}, {"title": "t"}]},
            None,
            None,
            "'ctxs[1]' needs a string 'text'",
        ),
        (
            {"question": "q?", "answers": ["a"], "ctxs": {"title": "t", "text": "x"}},
            None,
            None,
            "'ctxs' must be a list",
        ),
    ],
)
def test_selfrag_bad_row_is_one_line_naming_file_line_and_field(tmp_path, bad, fmt, task, field):
    path = _write(tmp_path, [GOOD, bad])
    message = _error(path, fmt, task)
    assert str(path) in message and "line 2" in message and field in message, message


@pytest.mark.parametrize(
    "bad, field",
    [
        ({**ARC, "answerKey": "E"}, "'answerKey' must be one of the choices' labels (A, B, C, D), got 'E'"),
        ({k: v for k, v in ARC.items() if k != "answerKey"}, "'answerKey'"),
        ({**ARC, "choices": {"label": ["A", "B"], "text": ["x"]}}, "'choices' must be"),
        ({**ARC, "choices": ["oxygen", "carbon dioxide"]}, "'choices' must be"),
    ],
)
def test_arc_bad_rows(tmp_path, bad, field):
    path = _write(tmp_path, [ARC, bad])
    message = _error(path)
    assert str(path) in message and "line 2" in message and field in message, message


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"question": "Claim.", "label": "mixture"}, "'label' must be true or false (got 'mixture')"),
        ({"question": "Claim.", "answers": ["maybe"]}, "'answers' must be true or false"),
        ({"question": "Claim."}, "'label' is missing"),
    ],
)
def test_pubhealth_bad_rows(tmp_path, bad, field):
    path = _write(tmp_path, [{"question": "Claim.", "label": "true"}, bad])
    message = _error(path)
    assert str(path) in message and "line 2" in message and field in message, message


@pytest.mark.parametrize(
    "bad, field",
    [
        (
            {**MUSIQUE, "paragraphs": [{"title": "X", "is_supporting": True}]},
            "'paragraphs[0]' needs a string 'paragraph_text'",
        ),
        ({**MUSIQUE, "paragraphs": [{"title": "X", "paragraph_text": None}]}, "'paragraphs[0]' needs a string"),
        ({k: v for k, v in MUSIQUE.items() if k != "paragraphs"}, "'paragraphs' is missing"),
        ({k: v for k, v in MUSIQUE.items() if k != "answer"}, "'answer' is missing"),
        ({**MUSIQUE, "answer_aliases": "Ada L."}, "'answer_aliases' must be a non-empty list"),
        ({k: v for k, v in MUSIQUE.items() if k != "question"}, "'question'"),
    ],
)
def test_musique_bad_rows(tmp_path, bad, field):
    path = _write(tmp_path, [MUSIQUE, bad])
    message = _error(path)
    assert str(path) in message and "line 2" in message and field in message, message


def test_json_array_errors_name_the_element_line(tmp_path):
    path = _write(tmp_path, [GOOD, GOOD, {"question": "q?", "possible_answers": "[oops"}], array=True)
    message = _error(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "[oops" in text) - 2
    assert f"line {line}:" in message and "'possible_answers'" in message, message
    broken = tmp_path / "broken.json"
    broken.write_text('[\n  {"question": "q?", "answers": ["a"]},\n  {"question": \n]\n')
    assert "line 4: not valid JSON" in _error(broken)
    trailing = tmp_path / "trailing.json"
    trailing.write_text('[{"question": "q?", "answers": ["a"]}]\n[1]\n')
    assert "line 2: not valid JSON" in _error(trailing)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "has no questions"),
        ("\n\n", "has no questions"),
        ("[]", "has no questions"),
        ('{"question": "q", "answers": ["a"]}\n{"question": \n', "line 2: not valid JSON"),
        ('{"question": "q", "answers": ["a"]}\n[1, 2]\n', "line 2: a row must be a JSON object"),
        (
            '{"prompt": "q", "output": "a"}\n',
            "line 1: cannot tell the format from the first row's fields (output, prompt)",
        ),
    ],
)
def test_file_level_errors(tmp_path, text, message):
    path = tmp_path / "data.jsonl"
    path.write_text(text)
    assert message in _error(path)


def test_task_and_format_mismatches(tmp_path):
    assert "line 1: 'choices' is missing: --task arc_c" in _error(MINI, None, "arc_c")
    assert "'ground_truth' must be true or false for --task pubhealth" in _error(MINI, None, "pubhealth")
    assert "line 1: 'choices' make this a multiple-choice (arc_c) row, not popqa" in _error(
        _write(tmp_path, [ARC]), None, "popqa"
    )
    assert "line 1: 'answer' is missing" in _error(MINI, "musique")
    assert "line 1: a row needs 'question' and 'ground_truth'" in _error(_write(tmp_path, [MUSIQUE]), "retrievalqa")
    assert "unknown format 'csv'" in _error(MINI, "csv")
    assert "unknown task 'squad'" in _error(MINI, None, "squad")
    assert "evaluation data file does not exist" in _error(tmp_path / "nope.jsonl")
