"""Self-RAG evaluation files (PopQA, TriviaQA, PubHealth, ARC-Challenge): the field names are a public contract.

- question: ``question`` or ``instruction`` (PubHealth: ``claim`` too)
- gold: PopQA ``possible_answers`` (a JSON-encoded list *string*), ``answers`` (list) or ``answer`` (string);
  PubHealth a true/false ``label`` (or ``answers``); ARC-Challenge ``answerKey`` with
  ``choices: {"label": [...], "text": [...]}``
- passages: ``ctxs`` or ``top_contexts``, each ``{title, text}`` (``id``/``score`` optional, dropped)
"""

from __future__ import annotations

import json
from typing import Any

from specrag_jax.evaluation.datasets.fields import (
    answer_list,
    answer_text,
    first_text,
    passages,
    question_id,
    row_error,
    short,
)
from specrag_jax.evaluation.datasets.metrics import normalize

QUESTION_FIELDS = ("question", "instruction", "claim")
GOLD_FIELDS = ("possible_answers", "answers", "answer")
CONTEXT_FIELDS = ("ctxs", "top_contexts")
FIELDS = QUESTION_FIELDS[1:] + GOLD_FIELDS + CONTEXT_FIELDS + ("choices", "answerKey", "label")


def _open_gold(obj: dict, where: str) -> list[str]:
    if "possible_answers" in obj:
        raw = obj["possible_answers"]
        try:
            value = json.loads(raw) if isinstance(raw, str) else None
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, list):
            raise row_error(
                where,
                "possible_answers",
                f'must be a JSON-encoded list string such as \'["a", "b"]\' (got {short(raw)})',
            )
        return answer_list(value, "possible_answers", where)
    if "answers" in obj:
        return answer_list(obj["answers"], "answers", where)
    if "answer" in obj:
        value = obj["answer"]
        if isinstance(value, list):
            return answer_list(value, "answer", where)
        return [answer_text(value, "answer", where)]
    raise row_error(where, "answers", "is missing: a row needs 'answers', 'answer' or 'possible_answers'")


def _claim_label(value: Any, field: str, where: str) -> str:
    if isinstance(value, bool):
        word = "true" if value else "false"
    else:
        word = normalize(value) if isinstance(value, str) else ""
    if word not in ("true", "false"):
        raise row_error(where, field, f"must be true or false (got {short(value)})")
    return word


def _pubhealth_gold(obj: dict, where: str) -> list[str]:
    if "label" in obj:
        return [_claim_label(obj["label"], "label", where)]
    field = "answers" if "answers" in obj else "answer"
    if field not in obj:
        raise row_error(where, "label", "is missing: a PubHealth row needs a true/false 'label' or 'answers'")
    values = obj[field] if isinstance(obj[field], list) and obj[field] else [obj[field]]
    return [_claim_label(v, field, where) for v in values]


def _arc(obj: dict, where: str) -> tuple[list[dict], list[str]]:
    choices = obj.get("choices")
    labels = choices.get("label") if isinstance(choices, dict) else None
    texts = choices.get("text") if isinstance(choices, dict) else None
    if not isinstance(labels, list) or not isinstance(texts, list) or not labels or len(labels) != len(texts):
        raise row_error(
            where,
            "choices",
            f'must be {{"label": [...], "text": [...]}} with lists of the same length (got {short(choices)})',
        )
    out = [
        {"label": answer_text(lab, f"choices.label[{i}]", where), "text": answer_text(t, f"choices.text[{i}]", where)}
        for i, (lab, t) in enumerate(zip(labels, texts))
    ]
    key = obj.get("answerKey")
    if not isinstance(key, (str, int)) or str(key) not in [c["label"] for c in out]:
        raise row_error(
            where,
            "answerKey",
            f"must be one of the choices' labels ({', '.join(c['label'] for c in out)}), got {short(key)}",
        )
    return out, [str(key)]


def infer_task(obj: dict) -> str:
    """The task a Self-RAG row belongs to, from its fields: arc_c, popqa, pubhealth or (otherwise) triviaqa."""
    if "choices" in obj or "answerKey" in obj:
        return "arc_c"
    if "possible_answers" in obj:
        return "popqa"
    if "label" in obj or "claim" in obj:
        return "pubhealth"
    gold = obj.get("answers", obj.get("answer"))
    gold = gold if isinstance(gold, list) and gold else [gold]
    if all(isinstance(g, (str, bool)) and normalize(str(g)) in ("true", "false") for g in gold):
        return "pubhealth"
    return "triviaqa"


def read_selfrag(obj: dict, where: str, task: str) -> dict:
    """One Self-RAG row -> the internal row (with ``task``; ``choices`` for arc_c)."""
    question = first_text(obj, QUESTION_FIELDS, where)
    multiple_choice = "choices" in obj or "answerKey" in obj
    choices = None
    if multiple_choice and task != "arc_c":
        raise row_error(where, "choices", f"make this a multiple-choice (arc_c) row, not {task}; pass --task arc_c")
    if task == "arc_c":
        choices, gold = _arc(obj, where)
    elif task == "pubhealth":
        gold = _pubhealth_gold(obj, where)
    else:
        gold = _open_gold(obj, where)
    field = next((f for f in CONTEXT_FIELDS if f in obj), None)
    context = passages(obj[field], field, where) if field else []
    source = str(obj.get("data_source") or task)
    row = {
        "question": question,
        "ground_truth": gold,
        "context": context,
        "data_source": source,
        "question_id": question_id(obj, source, question),
        "task": task,
    }
    if choices is not None:
        row["choices"] = choices
    return row
