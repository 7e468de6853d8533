"""Correctness of an answer: substring match for open-ended tasks, the exact label for closed-set ones."""

from __future__ import annotations

import re
from typing import Sequence

_STRIP = " \t\n.,:;!?\"'`*"
_PREFIX = re.compile(r"^(?:the\s+)?(?:correct\s+)?answer(?:\s+is)?\s*[:\-]?\s*")
CLAIM_WORDS = {"true": "true", "supports": "true", "false": "false", "refutes": "false"}


def normalize(text: str) -> str:
    """Lower case, single spaces, no surrounding punctuation or quotes."""
    return " ".join(str(text).lower().split()).strip(_STRIP)


def _prediction(answer: str) -> str:
    """The normalised answer without a leading "answer:" / "the answer is"."""
    return normalize(_PREFIX.sub("", normalize(answer)))


def contains_answer(answer: str, ground_truth: Sequence[str]) -> bool:
    """A gold string occurs in the answer, case-insensitively (PopQA/TriviaQA accuracy in Self-RAG and
    Speculative RAG; the same rule as ``evaluation.is_correct``)."""
    low = answer.lower()
    return any(str(g).strip().lower() in low for g in ground_truth if str(g).strip())


def choice_correct(answer: str, label: str, choices: Sequence[dict]) -> bool:
    """ARC: the answer is the gold label ("B", "(B)", "B)", optionally followed by the choice's text) or the gold
    choice's text itself."""
    pred, gold = _prediction(answer), normalize(label)
    texts = [normalize(c["text"]) for c in choices if normalize(c["label"]) == gold]
    text = texts[0] if texts else ""
    if text and pred == text:
        return True
    tail = rf"(?:\s*[-:]?\s*{re.escape(text)})?" if text else ""
    return re.fullmatch(rf"\(?{re.escape(gold)}\)?[.:)]?{tail}", pred) is not None


def claim_correct(answer: str, ground_truth: Sequence[str]) -> bool:
    """PubHealth: the answer is the gold true/false label (SUPPORTS/REFUTES read as true/false, as Self-RAG does)."""
    pred = CLAIM_WORDS.get(_prediction(answer))
    return pred is not None and any(pred == normalize(g) for g in ground_truth)


def score_answer(row: dict, answer: str) -> bool:
    """Whether ``answer`` is correct for ``row``, by the metric of its ``task`` (rows without one are open-ended)."""
    task = row.get("task")
    if task == "arc_c":
        return choice_correct(answer, row["ground_truth"][0], row.get("choices") or [])
    if task == "pubhealth":
        return claim_correct(answer, row["ground_truth"])
    return contains_answer(answer, row["ground_truth"])
