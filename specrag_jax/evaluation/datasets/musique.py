"""MuSiQue rows: ``question``, ``answer``, ``answer_aliases``, ``paragraphs: [{title, paragraph_text,
is_supporting}]`` (every paragraph becomes a passage, in order)."""

from __future__ import annotations

from specrag_jax.evaluation.datasets.fields import (
    answer_list,
    answer_text,
    first_text,
    passages,
    question_id,
    row_error,
)

FIELDS = ("paragraphs", "answer_aliases")


def read_musique(obj: dict, where: str, task: str) -> dict:
    """One MuSiQue row -> the internal row (gold: the answer, then its aliases)."""
    question = first_text(obj, ("question",), where)
    if "answer" not in obj:
        raise row_error(where, "answer", "is missing")
    gold = [answer_text(obj["answer"], "answer", where)]
    if obj.get("answer_aliases"):
        gold += answer_list(obj["answer_aliases"], "answer_aliases", where)
    if "paragraphs" not in obj:
        raise row_error(where, "paragraphs", "is missing")
    context = passages(obj["paragraphs"], "paragraphs", where, text_key="paragraph_text")
    source = str(obj.get("data_source") or "musique")
    return {
        "question": question,
        "ground_truth": gold,
        "context": context,
        "data_source": source,
        "question_id": question_id(obj, source, question),
        "task": task,
    }
