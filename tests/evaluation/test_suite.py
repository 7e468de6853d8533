"""`specrag eval --suite DIR` / repeated --data: Table 1 from every file of a folder (tiny models), the same answers
from the dev set read as RetrievalQA, Self-RAG and MuSiQue files, closed-set files, and one-line input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.convert_formats import write_musique, write_selfrag
from specrag_jax.cli import main
from specrag_jax.evaluation.datasets import load_rows
from specrag_jax.models.text_model import TextModel
from specrag_jax.serving.tiny import tiny_text_model

DEV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "retrievalqa_dev.jsonl"
MINI = Path(__file__).parents[1] / "pipeline" / "data" / "mini_eval.jsonl"
TINY = [
    "--drafter",
    "tiny:llama",
    "--verifier",
    "tiny:gemma3",
    "--max-seq-len",
    "1024",
    "--n-docs",
    "3",
    "--m",
    "2",
    "--k",
    "2",
    "--quiet",
]
METHODS = "standard,speculative,drafter_only"


@pytest.fixture
def tiny_cli(monkeypatch):
    """The CLI on tiny random models, without the on-disk XLA cache (greedy decoding: deterministic)."""
    models = {
        "tiny:llama": tiny_text_model("tiny:llama", seed=1, num_pages=192, page_size=16, max_seq_len=1024),
        "tiny:gemma3": tiny_text_model("tiny:gemma3", seed=2, num_pages=192, page_size=16, max_seq_len=1024),
    }
    monkeypatch.setattr(TextModel, "load", classmethod(lambda cls, name, **kw: models[name]))
    monkeypatch.setattr("specrag_jax.cli.enable_compilation_cache", lambda: None)


def _jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _answers(folder: Path) -> dict[tuple[str, str], tuple[str, bool]]:
    """(method, question_id) -> (answer, correct) from a suite file's predictions.jsonl."""
    preds = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    return {(p["method"], p["question_id"]): (p["answer"], p["correct"]) for p in preds}


def test_converted_formats_give_the_retrievalqa_accuracies(tmp_path, capsys, tiny_cli):
    if not DEV.is_file():
        pytest.skip(f"{DEV} is absent")
    rows = load_rows(DEV).rows[::35][:3]  # three questions of different sources, read by the RetrievalQA reader
    suite = tmp_path / "suite"
    suite.mkdir()
    _jsonl(rows, suite / "a_retrievalqa.jsonl")
    write_selfrag(rows, suite / "b_selfrag.jsonl")
    write_musique(rows, suite / "c_musique.json", array=True)
    (suite / "README.txt").write_text("not an evaluation file: ignored")
    out = tmp_path / "out"
    assert main(["eval", "--suite", str(suite), "--methods", METHODS, "--out", str(out), "--json"] + TINY) == 0
    table = json.loads(capsys.readouterr().out)
    assert table == json.loads((out / "table.json").read_text())
    assert table["columns"] == ["retrievalqa", "triviaqa", "musique"]
    assert [(f["format"], f["task"], f["n"], f["n_docs"], f["m"], f["k"]) for f in table["files"].values()] == [
        ("retrievalqa", None, 3, 3, 2, 2),
        ("selfrag", "triviaqa", 3, 3, 2, 2),
        ("musique", "musique", 3, 3, 2, 2),
    ]
    assert list(table["rows"]) == METHODS.split(",")
    for method, cells in table["rows"].items():
        assert len({c["accuracy"] for c in cells.values()}) == 1, (method, cells)
        assert all(c["n"] == 3 and c["latency_s"] > 0 for c in cells.values())
        assert all(c["latency_reduction"] == 0.0 for c in cells.values()) or method != "standard"
    # the same answers, question by question: the three readers gave the engine the same questions and passages
    answers = [_answers(out / column) for column in ("retrievalqa", "triviaqa", "musique")]
    assert answers[0] == answers[1] == answers[2] and len(answers[0]) == 9
    results = json.loads((out / "musique" / "results.json").read_text())  # each file keeps the eval JSON contract
    assert set(results) >= {"methods", "config", "selection", "ablations"} and results["config"]["task"] == "musique"
    assert table["paper"]["speculative"]["accuracy"]["arc_c"] == 80.55 and table["hardware"]["backend"] == "cpu"
    assert table["models"] == {"drafter": "tiny:llama", "drafter_adapter": None, "verifier": "tiny:gemma3"}
    md = (out / "table.md").read_text()
    assert "| speculative | " in md and "retrievalqa (n=3, retrievalqa)" in md and "| 74.24 | 31.57 |" in md


ARC_ROWS = [
    {
        "id": "arc1",
        "question": "Which gas do plants take in?",
        "answerKey": "B",
        "choices": {"label": ["A", "B", "C"], "text": ["oxygen", "carbon dioxide", "helium"]},
        "ctxs": [
            {"title": "Leaves", "text": "Plants take in carbon dioxide."},
            {"title": "Air", "text": "Air holds oxygen."},
            {"title": "Sun", "text": "Light."},
        ],
    }
]
CLAIM_ROWS = [
    {
        "id": "ph1",
        "claim": "Vitamin C cures colds.",
        "label": "false",
        "ctxs": [
            {"title": "Study", "text": "No cure was found."},
            {"title": "Tea", "text": "Tea."},
            {"title": "Rest", "text": "Rest helps."},
        ],
    }
]


def test_closed_set_files_and_repeated_data(tmp_path, capsys, tiny_cli):
    arc = _jsonl(ARC_ROWS, tmp_path / "arc.jsonl")
    claims = _jsonl(CLAIM_ROWS, tmp_path / "health.jsonl")
    args = ["eval", "--data", str(arc), "--data", str(claims), "--methods", METHODS, "--out", str(tmp_path / "o")]
    assert main(args + TINY) == 0
    md = capsys.readouterr().out
    assert md.startswith("## This run") and "arc_c (n=1, selfrag)" in md and "pubhealth (n=1, selfrag)" in md
    labels = {"arc_c": ("A", "B", "C"), "pubhealth": ("true", "false")}
    for column, allowed in labels.items():
        for p in (json.loads(x) for x in (tmp_path / "o" / column / "predictions.jsonl").read_text().splitlines()):
            for d in p["drafts"]:  # a draft's answer is a label, or it did not give one and counts as unparsed
                assert d["answer"] in allowed if d["parsed"] else True
            assert p["correct"] == (p["answer"] == {"arc_c": "B", "pubhealth": "false"}[column])


@pytest.mark.parametrize(
    "files, extra, message",
    [
        ({}, [], "no evaluation files (*.jsonl or *.json) in the folder"),
        ({"x.jsonl": [{"query": "q", "gold": "a"}]}, [], "x.jsonl, line 1: cannot tell the format"),
        (
            {"arc.jsonl": [{**ARC_ROWS[0], "choices": {"label": ["A", "", "C"], "text": ["a", "b", "c"]}}]},
            [],
            "arc.jsonl, line 1: 'choices.label[1]' must be a non-empty string",
        ),
        ({"a.jsonl": [{"question": "q", "ground_truth": ["a"]}]}, ["--task", "nope"], "unknown task 'nope'"),
        (
            {"a.jsonl": [{"question": "q", "ground_truth": ["a"], "choices": [{"text": "x"}]}]},
            ["--task", "arc_c"],
            "a.jsonl, line 1: 'choices[0].label' is missing or empty",
        ),
        (
            {"a.jsonl": [{"question": "q", "ground_truth": ["a"]}]},
            ["--corpus", "c.jsonl"],
            "--corpus reads one data file",
        ),
    ],
)
def test_suite_bad_input_is_one_line(tmp_path, capsys, files, extra, message):
    for name, rows in files.items():
        _jsonl(rows, tmp_path / name)
    assert main(["eval", "--suite", str(tmp_path)] + extra + TINY) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "eval needs --data FILE (repeat it for a suite) or --suite DIR"),
        (["--suite", "/nonexistent"], "--suite /nonexistent: not a folder"),
        (["--data", str(MINI), "--data", str(MINI)], "the same file is given twice"),
    ],
)
def test_eval_needs_data_or_a_suite(capsys, args, message):
    assert main(["eval"] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
