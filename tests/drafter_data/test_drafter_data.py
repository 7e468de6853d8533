"""Drafter training data: teacher rationales, their checks, exact drafter prompts, bad rows, corpus-only mode."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specrag_jax.cli import main as cli_main
from specrag_jax.drafter_data.examples import (
    CHECKS,
    NOT_HELD,
    DrafterDataBuilder,
    draft_target,
    passes,
    rationale_checks,
    teacher_prompt,
)
from specrag_jax.drafter_data.synthetic_questions import (
    answer_in_question,
    grounded,
    parse_question_answer,
    synthetic_rows,
)
from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.drafting import draft_prompts
from specrag_jax.pipeline.prompts import occurs_in_passages

ROW = {
    "question": "Who wrote Hamlet?",
    "ground_truth": ["William Shakespeare", "Shakespeare"],
    "context": [
        {"title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."},
        {"title": "Globe", "text": "The Globe theatre was in London."},
        {"title": "Verona", "text": "Romeo and Juliet is set in Verona."},
    ],
}


class ScriptedTeacher:
    """A teacher whose outputs are given: one per prompt, in order (records the prompts it saw)."""

    name, instruct = "scripted", False

    def __init__(self, outputs: list[str]) -> None:
        self.outputs, self.prompts = list(outputs), []

    def generate(self, prompts, sampling=None, max_new_tokens=64, stop=(), chat=False):
        self.prompts += prompts
        return [SimpleNamespace(text=self.outputs.pop(0), token_ids=[1, 2]) for _ in prompts]


def two_subsets(question, docs, k, m, seed):
    return [[0, 1], [2]], {}


@pytest.fixture(scope="module")
def drafter():
    from specrag_jax.serving.tiny import tiny_text_model

    return tiny_text_model("tiny:llama", seed=1, num_pages=64)


def test_rationale_checks():
    answers = ["Shakespeare"]
    assert rationale_checks("Document [1] says Shakespeare wrote it.", answers, 2) == ["answer", "citation"]
    assert rationale_checks("[3] names the author.", answers, 2) == []  # cites a document the subset lacks
    assert rationale_checks("Shakespeares cousin wrote it", answers, 2) == []  # whole words only
    assert rationale_checks("As [2] says, it was SHAKESPEARE.", answers, 2) == ["answer", "citation"]


def test_examples_use_drafting_prompts_and_record_checks(drafter):
    teacher = ScriptedTeacher(["Per [1], William Shakespeare wrote it.\nextra line", "NONE"])
    builder = DrafterDataBuilder(drafter, teacher, two_subsets, max_doc_tokens=200)  # nothing cut
    [ex] = builder.examples(ROW)
    docs = [{**d, "id": str(i)} for i, d in enumerate(ROW["context"])]
    prefix, suffixes = draft_prompts(drafter, ROW["question"], [docs[:2]])
    assert ex["prompt_ids"] == prefix + suffixes[0]  # the very ids drafting feeds the drafter
    assert ex["target"] == draft_target("Per [1], William Shakespeare wrote it.", "William Shakespeare")
    assert ex["target_ids"] == drafter.tokenizer.encode(ex["target"], add_bos=False)
    assert ex["checks"] == ["answer", "citation", "grounded"] and ex["doc_ids"] == ["ctx0", "ctx1"]
    assert "## Answer: William Shakespeare" in teacher.prompts[0] and "[2] Globe" in teacher.prompts[0]
    assert builder.stats.kept == 1 and builder.stats.examples == 2
    assert builder.stats.rejected == {"teacher said the documents do not support the answer": 1}


def test_bad_rows_and_long_examples_are_skipped_with_their_reason(drafter):
    builder = DrafterDataBuilder(
        drafter,
        ScriptedTeacher(["It is [1].", "no idea"]),
        two_subsets,
        max_doc_tokens=40,
        max_tokens=50,
        require="either",
    )
    assert builder.examples({"question": "Q?", "context": ["a passage"]}) == []
    assert builder.examples({"question": " ", "ground_truth": ["x"], "context": ["p"]}) == []
    assert builder.examples({"question": "Q?", "ground_truth": ["x"]}) == []
    assert builder.stats.skipped_rows == {
        "missing answers (ground_truth)": 1,
        "missing question": 1,
        "missing passages (context)": 1,
    }
    assert builder.examples(ROW) == []  # the char-level prompt is far longer than 50 tokens
    assert builder.stats.rejected == {
        "longer than max_tokens (50)": 1,
        "rationale neither mentions the answer nor cites a document": 1,
    }


def test_the_required_check_decides_what_is_kept(drafter):
    assert passes(["answer"], "answer") and not passes(["citation"], "answer")
    assert passes(["citation"], "either") and not passes(["citation"], "both") and passes(list(CHECKS), "both")
    contradiction = "Yes, per [1] it was Marlowe."  # cites a document, names no gold answer
    outs = {
        req: DrafterDataBuilder(
            drafter, ScriptedTeacher([contradiction, contradiction]), two_subsets, max_doc_tokens=200, require=req
        )
        for req in ("answer", "either")
    }
    assert outs["answer"].examples(ROW) == [] and len(outs["either"].examples(ROW)) == 2
    assert outs["answer"].stats.rejected == {  # the first subset holds the gold answer, the second does not
        "rationale fails the required check (answer; passed: citation, grounded)": 1,
        "rationale fails the required check (answer; passed: citation)": 1,
    }
    with pytest.raises(SpecRagError, match="require must be one of"):
        DrafterDataBuilder(drafter, ScriptedTeacher([]), two_subsets, require="any")


def test_answers_occur_in_passages_as_whole_normalised_words():
    docs = [{"title": "Hamlet", "text": "A tragedy by William Shakespeare."}, {"text": "The Globe, London."}]
    assert occurs_in_passages("william SHAKESPEARE", docs) and occurs_in_passages("the globe", docs)
    assert occurs_in_passages("Hamlet", docs)  # titles count: the drafter reads them
    assert not occurs_in_passages("Shakespear", docs) and not occurs_in_passages("Marlowe", docs)
    assert not occurs_in_passages("", docs) and not occurs_in_passages("...", docs)


def test_grounded_keeps_only_answers_the_subsets_passages_hold(drafter):
    """The teacher is shown the gold answer and states it for a subset without it (Verona); ``grounded`` drops
    that example, ``answer`` keeps it, and every kept example records whether it is grounded."""
    assert passes(["answer", "grounded"], "grounded") and not passes(["answer", "citation"], "grounded")
    assert not passes(["citation", "grounded"], "grounded") and not passes(["grounded"], "either")
    rationales = ["Per [1], William Shakespeare wrote it.", "Per [1], William Shakespeare wrote it."]
    answer = DrafterDataBuilder(drafter, ScriptedTeacher(list(rationales)), two_subsets, max_doc_tokens=200)
    grounded = DrafterDataBuilder(
        drafter, ScriptedTeacher(list(rationales)), two_subsets, max_doc_tokens=200, require="grounded"
    )
    assert [ex["checks"] for ex in answer.examples(ROW)] == [["answer", "citation", "grounded"], ["answer", "citation"]]
    [kept] = grounded.examples(ROW)
    assert kept["doc_ids"] == ["ctx0", "ctx1"] and grounded.stats.checks_passed["grounded"] == 1
    # the Verona subset holds no gold answer: never shown to the teacher (one prompt, not two)
    assert grounded.stats.rejected == {NOT_HELD: 1} and grounded.stats.examples == 1
    assert len(grounded.teacher.prompts) == 1 and "[1] Hamlet" in grounded.teacher.prompts[0]
    none_held = DrafterDataBuilder(drafter, ScriptedTeacher([]), lambda *a: ([[2]], {}), require="grounded")
    assert none_held.examples(ROW) == [] and none_held.stats.rejected == {NOT_HELD: 1}


def test_synthetic_questions_are_parsed_grounded_and_shuffled():
    assert parse_question_answer("Question: Who built it?\nAnswer: the Romans.") == ("Who built it?", "the Romans")
    assert parse_question_answer("Who built it? The Romans") is None
    passage = {"id": "d0", "title": "Aqueduct", "text": "The Romans built the aqueduct in 19 BC."}
    assert grounded("the Romans", passage) and not grounded("the Greeks", passage)
    assert not grounded("a b c d e f g h i j", {"text": "a b c d e f g h i j"})  # too long to be an answer
    corpus = [passage] + [{"id": f"d{i}", "title": "", "text": f"filler {i}"} for i in range(1, 6)]
    teacher = ScriptedTeacher(
        [
            "Question: Who built the aqueduct?\nAnswer: The Romans",
            "Answer only",
            "Question: When did the Romans build the aqueduct?\nAnswer: the Romans",  # the answer is in the question
        ]
    )
    rows, dropped = synthetic_rows(teacher, [*corpus[:2], passage], lambda q, n: corpus[:n], n_docs=4, batch=2)
    assert dropped == {"no 'Question:' and 'Answer:' lines": 1, "answer occurs in the question": 1}
    assert answer_in_question("What is Jay Silva's full name?", "Jay Silva") and not answer_in_question("Q?", "")
    [row] = rows
    assert row["ground_truth"] == ["The Romans"] and len(row["context"]) == 4
    assert passage["text"] in [c["text"] for c in row["context"]]
    assert sorted(c["id"] for c in row["context"]) == ["d0", "d1", "d2", "d3"]  # the corpus's ids are kept


def test_teacher_prompt_numbers_documents_as_the_drafter_sees_them():
    text = teacher_prompt("Q?", [{"title": "T", "text": "x"}, {"text": "y"}], "A")
    assert "[1] T\nx\n[2] y\n## Question: Q?\n## Answer: A" in text


@pytest.mark.slow
def test_cli_writes_exact_prompts_with_real_models(tmp_path):
    from specrag_jax.models.tokenizer.load import load_tokenizer

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(ROW) + "\n" + json.dumps({"question": "No passages?", "ground_truth": ["x"]}) + "\n")
    out = tmp_path / "out" / "drafter.jsonl"
    rc = cli_main(
        [
            "make-drafter-data",
            "--data",
            str(data),
            "--out",
            str(out),
            "--drafter",
            "smollm2-135m-instruct",
            "--teacher",
            "smollm2-135m-instruct",
            "--m",
            "2",
            "-q",
            "--json",
        ]
    )
    if rc == 0:
        summary = json.loads((out.parent / "drafter.jsonl.summary.json").read_text())
        assert summary["skipped_rows"] == {"missing passages (context)": 1} and summary["rows"] == 2
        tok = load_tokenizer("smollm2-135m-instruct")
        for line in out.read_text().splitlines():
            ex = json.loads(line)
            assert tok.encode_rendered(ex["prompt"]) == ex["prompt_ids"]  # text and ids agree
            assert ex["prompt"].endswith("## Rationale:") and ex["checks"]
        replayed = tmp_path / "replayed.jsonl"  # the records rebuild the same examples with the real tokenizer
        records = str(out.parent / "drafter.jsonl.records.jsonl")
        args = ["--data", str(data), "--out", str(replayed), "--drafter", "smollm2-135m-instruct", "-q"]
        assert cli_main(["make-drafter-data", *args, "--replay", records]) == 0
        assert replayed.read_text() == out.read_text()
    else:  # nothing passed: a one-line error, and no output file
        assert not out.exists()


def test_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "no question field"}) + "\n")
    assert (
        cli_main(
            ["make-drafter-data", "--data", str(bad), "--out", str(tmp_path / "o.jsonl"), "--drafter", "tiny:llama"]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrag: error:") and "'question'" in err and "\n" not in err
