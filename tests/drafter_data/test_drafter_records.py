"""Drafter examples stored by reference: records hold no passage text and replay to the very same examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrag_jax.cli import main as cli_main
from specrag_jax.drafter_data.examples import DrafterDataBuilder
from specrag_jax.drafter_data.records import (
    passage_fingerprint,
    passages_by_source,
    rationale_of,
    read_records,
    records_from_examples,
    replay_examples,
    write_records,
)
from specrag_jax.drafter_data.synthetic_questions import synthetic_rows
from specrag_jax.errors import SpecRagError
from tests.drafter_data.test_drafter_data import ROW, ScriptedTeacher, two_subsets

QROW = {**ROW, "question_id": "q-hamlet"}
RATIONALES = ["Per [1], William Shakespeare wrote it.", "As [1] says, Shakespeare."]


@pytest.fixture(scope="module")
def drafter():
    from specrag_jax.serving.tiny import tiny_text_model

    return tiny_text_model("tiny:llama", seed=1, num_pages=64)


def _examples(drafter, row, max_doc_tokens=200, source="data"):
    builder = DrafterDataBuilder(drafter, ScriptedTeacher(list(RATIONALES)), two_subsets, max_doc_tokens=max_doc_tokens)
    return builder.examples(row, source)


@pytest.mark.parametrize("max_doc_tokens", [200, 3])  # nothing cut / every passage cut to 3 tokens
def test_records_replay_to_the_same_examples(drafter, max_doc_tokens):
    examples = _examples(drafter, QROW, max_doc_tokens)
    assert len(examples) == 2
    passages = passages_by_source([QROW])
    records = records_from_examples(examples, passages)
    text = json.dumps(records)
    assert not any(d["text"] in text for d in QROW["context"])  # no passage text is stored
    replayed, skipped = replay_examples(drafter, records, passages, max_doc_tokens=max_doc_tokens)
    assert replayed == examples and skipped == {}
    if max_doc_tokens == 200:  # negative control: other truncation, other prompts
        assert replay_examples(drafter, records, passages, max_doc_tokens=2)[0] != examples
    # a row without a question id is found by its question text
    rowless = [{k: v for k, v in ex.items() if k != "question_id"} for ex in _examples(drafter, ROW, max_doc_tokens)]
    assert replay_examples(drafter, records_from_examples(rowless, passages), passages_by_source([ROW]))[0]
    # a tighter max_tokens skips what no longer fits, as the builder does
    assert replay_examples(drafter, records, passages, max_doc_tokens=max_doc_tokens, max_tokens=5) == (
        [],
        {"longer than max_tokens": 2},
    )
    # --require filters by the checks the teacher's rationale passed when it was written
    grounded, skipped = replay_examples(drafter, records, passages, max_doc_tokens=max_doc_tokens, require="grounded")
    expected = [ex for ex in examples if "grounded" in ex["checks"]]  # whole passages: the Hamlet subset only
    assert len(expected) == (1 if max_doc_tokens == 200 else 0)
    assert grounded == expected and skipped == {"fails grounded": 2 - len(expected)}
    with pytest.raises(SpecRagError, match="require must be one of"):
        replay_examples(drafter, records, passages, require="cited")


def test_corpus_records_name_corpus_passages(drafter):
    corpus = [{"id": "c0", "title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."}] + [
        {"id": f"c{i}", "title": "", "text": f"filler passage {i}"} for i in range(1, 5)
    ]
    teacher = ScriptedTeacher(["Question: Who wrote Hamlet?\nAnswer: William Shakespeare"])
    [row], _ = synthetic_rows(teacher, corpus[:1], lambda q, n: corpus[:n], n_docs=3)
    examples = _examples(drafter, row, source="corpus")
    assert {i for ex in examples for i in ex["doc_ids"]} <= {"c0", "c1", "c2"}
    passages = passages_by_source(corpus=corpus)
    records = records_from_examples(examples, passages)
    assert replay_examples(drafter, records, passages)[0] == examples
    with pytest.raises(SpecRagError, match="no corpus was given"):
        replay_examples(drafter, records, passages_by_source([QROW]))


def test_replay_refuses_changed_or_missing_passages(drafter):
    records = records_from_examples(_examples(drafter, QROW), passages_by_source([QROW]))
    edited = {**QROW, "context": [{**QROW["context"][0], "text": "Hamlet is a play."}, *QROW["context"][1:]]}
    with pytest.raises(SpecRagError, match=r"passage\(s\) \['ctx0'\] differs"):
        replay_examples(drafter, records, passages_by_source([edited]))
    with pytest.raises(SpecRagError, match="'q-hamlet' is not in the data file"):
        replay_examples(drafter, records, passages_by_source([{**ROW, "question_id": "other", "question": "x?"}]))
    shorter = {**QROW, "context": QROW["context"][:1]}
    with pytest.raises(SpecRagError, match=r"passage ids \['ctx1'\] are not in the data"):
        replay_examples(drafter, records, passages_by_source([shorter]))
    with pytest.raises(SpecRagError, match="record 1 lacks rationale"):
        replay_examples(drafter, [{k: v for k, v in records[0].items() if k != "rationale"}], {})
    with pytest.raises(SpecRagError, match="must be 'data' or 'corpus'"):
        replay_examples(drafter, [{**records[0], "source": "web"}], {})


def test_rationale_is_read_back_from_older_examples_without_the_field(drafter):
    ex = _examples(drafter, QROW)[0]
    old = {k: v for k, v in ex.items() if k != "rationale"}
    assert rationale_of(old) == ex["rationale"] == RATIONALES[0]
    with pytest.raises(SpecRagError, match="has no '## Response:' line"):
        rationale_of({"target": "no response line"})


def test_cli_replays_records_without_a_teacher(drafter, tmp_path, capsys, monkeypatch):
    from specrag_jax.models.text_model import TextModel

    monkeypatch.setattr(TextModel, "load", classmethod(lambda cls, name, **kw: drafter))  # the tiny drafter
    examples = _examples(drafter, QROW)
    data, recs, out = tmp_path / "rows.jsonl", tmp_path / "r.records.jsonl", tmp_path / "replayed.jsonl"
    data.write_text(json.dumps(QROW) + "\n")
    write_records(records_from_examples(examples, passages_by_source([QROW])), recs)
    base = ["make-drafter-data", "--data", str(data), "--out", str(out), "--drafter", "tiny", "-q"]
    assert cli_main([*base, "--replay", str(recs)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == examples
    assert json.loads((tmp_path / "replayed.jsonl.summary.json").read_text())["kept"] == 2
    # records of both kinds replay together into one output (the synthetic-data adapter's training file)
    corpus = [{"id": "c0", "title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."}] + [
        {"id": f"c{i}", "title": "", "text": f"filler passage {i}"} for i in range(1, 5)
    ]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    teacher = ScriptedTeacher(["Question: Who wrote Hamlet?\nAnswer: William Shakespeare"])
    [row], _ = synthetic_rows(teacher, corpus[:1], lambda q, n: corpus[:n], n_docs=3)
    synthetic = _examples(drafter, row, source="corpus")
    write_records(records_from_examples(synthetic, passages_by_source(corpus=corpus)), tmp_path / "s.records.jsonl")
    both = [*base, "--corpus", str(tmp_path / "corpus.jsonl"), "--replay", str(recs)]
    assert cli_main([*both, "--replay", str(tmp_path / "s.records.jsonl")]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == examples + synthetic
    assert cli_main(both[:-2]) == 2  # both sources without --replay
    assert "give one of --data or --corpus" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text("[1, 2]\n")
    out.unlink()
    assert cli_main([*base, "--replay", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("specrag: error:") and "one JSON object per line" in err and not out.exists()


DEV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "retrievalqa_dev.jsonl"
RECORDS = Path(__file__).resolve().parents[2] / "specrag_jax" / "drafter_data" / "drafter_records"


@pytest.mark.slow
def test_tracked_records_replay_from_the_dev_file_and_name_no_held_out_passage():
    """Every records file in specrag_jax/drafter_data/drafter_records/ rebuilds from the dev file (every fingerprint
    matches) and touches neither a train-calibrate nor a held-out question or passage (the adapters' choice and
    report stay clean)."""
    if not DEV.is_file():
        pytest.skip(f"{DEV} is absent")
    from specrag_jax.evaluation.holdout import split_rows
    from specrag_jax.evaluation.run import load_questions
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.retrieval.pooling import own_passages, pool_passages

    rows = load_questions(DEV)
    fit = split_rows(rows, "train-fit")
    others = [r for r in rows if all(r is not f for f in fit)]
    pool = pool_passages(fit, exclude=others)
    passages = passages_by_source(fit, pool)
    records = [r for path in sorted(RECORDS.glob("*.records.jsonl")) for r in read_records(path)]
    examples, skipped = replay_examples(TextModel.load("smollm2-135m-instruct"), records, passages, require="grounded")
    grounded = sum("grounded" in r["checks"] for r in records)
    assert grounded >= 133  # the first grounded records; later teacher runs only add
    assert len(examples) == grounded and skipped == {"fails grounded": len(records) - grounded}
    unseen = {passage_fingerprint(d) for r in others for d in own_passages(r)}
    assert not unseen & {fp for r in records for fp in r["doc_fingerprints"]}
    assert not {r.get("question_id") for r in others} & {r["question_id"] for r in records}
