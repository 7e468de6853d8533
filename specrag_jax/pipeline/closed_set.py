"""Closed-set questions (the paper's ARC-Challenge and PubHealth): what the prompts add and how answers become labels.

A ``ClosedSet`` travels with one question (``SpecRAG.answer(..., closed_set=...)``; ``from_row`` builds it from an
evaluation row's ``task`` and ``choices``). The prompts put its ``instruction`` after the question (ARC: the
choices as ``A: text`` lines, then Self-RAG's instruction; PubHealth: the true/false instruction), the drafter is
asked for the label alone, and every answer (each draft's, standard RAG's, closed book's) is parsed to an exact
label by ``parse``, so that answer-level aggregation pools the drafts that chose the same label. Open-ended
questions have no ``ClosedSet`` (None) and keep their prompts unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from specrag_jax.errors import SpecRagError

CLOSED_TASKS = ("arc_c", "pubhealth")
# Self-RAG's instructions for the two closed-set tasks (run_short_form.py), with the labels this question has
CLAIM_INSTRUCTION = "Is the following statement correct or not? Say true if it's correct; otherwise say false."
CLAIM_WORDS = {"true": "true", "supports": "true", "false": "false", "refutes": "false"}
_PREFIX = re.compile(
    r"^\W*(?:the\s+)?(?:correct\s+|best\s+)?(?:answer|choice|response|option)?(?:\s+is)?\W*", re.IGNORECASE
)


def _join(labels: Sequence[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


@dataclasses.dataclass(frozen=True)
class ClosedSet:
    """One closed-set question: ``task`` (arc_c or pubhealth) and its ``labels`` (with ``texts`` for arc_c)."""

    task: str
    labels: tuple[str, ...]
    texts: tuple[str, ...] = ()

    @property
    def instruction(self) -> str:
        """The lines after the question: ARC's choices and instruction, or PubHealth's true/false instruction."""
        if self.task == "pubhealth":
            return CLAIM_INSTRUCTION
        lines = "".join(f"{label}: {text}\n" for label, text in zip(self.labels, self.texts))
        return (
            f"{lines}Given {len(self.labels)} answer candidates, {_join(self.labels)}, choose the best answer choice."
        )

    @property
    def response_hint(self) -> str:
        """What the drafter's '## Response:' holds for this question."""
        if self.task == "pubhealth":
            return "true or false"
        return f"only the letter of the best choice ({_join(self.labels)})"

    def parse(self, answer: str) -> str:
        """The label ``answer`` gives, or "" when it gives none. Rule: ARC, the label the answer starts with
        (after "answer is"/"(", before a non-word character; any case when it is the whole answer), else the one
        choice whose text the answer holds; PubHealth, the first true/false word (supports/refutes count)."""
        if self.task == "pubhealth":
            words = re.findall(r"[a-z]+", answer.lower())
            return next((CLAIM_WORDS[w] for w in words if w in CLAIM_WORDS), "")
        text = _PREFIX.sub("", answer.strip(), count=1)
        for label in self.labels:
            if re.match(rf"{re.escape(label)}(?!\w)", text) or text.rstrip(".):").lower() == label.lower():
                return label
        low = answer.lower()
        held = [label for label, t in zip(self.labels, self.texts) if t.strip() and t.strip().lower() in low]
        return held[0] if len(held) == 1 else ""


def closed_set(task: str | None, choices: Sequence[dict] | None = None, where: str = "row") -> ClosedSet | None:
    """The ``ClosedSet`` of a question of ``task`` (None for open-ended tasks); arc_c needs ``choices``
    (``[{"label", "text"}]``, every label a non-empty string): a one-line error naming ``where`` otherwise."""
    if task not in CLOSED_TASKS:
        return None
    if task == "pubhealth":
        return ClosedSet("pubhealth", ("true", "false"))
    if not choices:
        raise SpecRagError(f"{where}: 'choices' is missing: an arc_c question needs its choices")
    if not isinstance(choices, (list, tuple)):
        raise SpecRagError(f"{where}: 'choices' must be a list of {{label, text}} objects (got {choices!r:.60})")
    labels, texts = [], []
    for i, c in enumerate(choices):
        label = c.get("label") if isinstance(c, dict) else None
        if not isinstance(label, str) or not label.strip():
            raise SpecRagError(f"{where}: 'choices[{i}].label' is missing or empty (got {c!r:.60})")
        text = c.get("text")
        if not isinstance(text, str):
            raise SpecRagError(f"{where}: 'choices[{i}].text' must be a string (got {text!r:.60})")
        labels.append(label.strip())
        texts.append(text.strip())
    if len(set(labels)) != len(labels):
        raise SpecRagError(f"{where}: 'choices' labels repeat ({', '.join(labels)})")
    return ClosedSet("arc_c", tuple(labels), tuple(texts))


def from_row(row: dict) -> ClosedSet | None:
    """The ``ClosedSet`` of an evaluation row (``evaluation.datasets.load_rows``): from its ``task`` and ``choices``."""
    return closed_set(row.get("task"), row.get("choices"), f"question {row.get('question_id', row.get('question'))!r}")
