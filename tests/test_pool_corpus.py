"""benchmarks/pool_corpus.py: the pooled corpus, and --split train sharing no passage with held-out questions."""

from __future__ import annotations

import json

from benchmarks.pool_corpus import main
from specrag_jax.evaluation.holdout import split_rows
from specrag_jax.retrieval.pooling import passage_key, pool_passages


def _rows() -> list[dict]:
    """Ten questions, each with its own passage and a second one; question 9's second is question 0's."""
    return [
        {
            "data_source": "s",
            "question_id": f"q{i}",
            "question": f"question {i}?",
            "ground_truth": [f"a{i}"],
            "context": [f"own passage {i}", {"title": "t", "text": f"shared  passage {min(i, (i + 1) % 10)}"}],
        }
        for i in range(10)
    ]


def _corpus(tmp_path, split: str) -> set[str]:
    data, out = tmp_path / "d.jsonl", tmp_path / f"{split}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    assert main(["--data", str(data), "--out", str(out), "--split", split]) == 0
    return {passage_key(json.loads(line)) for line in out.read_text().splitlines()}


def test_all_pools_every_passage_once(tmp_path):
    assert len(_corpus(tmp_path, "all")) == 10 + 9  # whitespace-normalised text identifies a passage


def test_train_corpus_holds_no_passage_of_a_heldout_question(tmp_path):
    rows = _rows()
    held, train = split_rows(rows, "heldout"), split_rows(rows, "train")
    assert held and train
    corpus = _corpus(tmp_path, "train")
    held_keys = {passage_key(d) for d in pool_passages(held)}
    assert corpus and not corpus & held_keys
    assert corpus == {passage_key(d) for d in pool_passages(train)} - held_keys  # nothing else left out


def test_exclude_leaves_out_passages_of_excluded_rows():
    rows = _rows()
    assert [d["id"] for d in pool_passages(rows[:2], exclude=rows[2:3])] == ["p0", "p1", "p2", "p3"]
    assert {d["text"] for d in pool_passages(rows[1:2], exclude=rows[:1])} == {"own passage 1", "shared  passage 1"}
