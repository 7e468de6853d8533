"""Prompt text of every stage and the parser of drafts ("## Rationale: ... ## Response: ...").

Drafter prompt (paper, Appendix H) with the question *before* the evidence, so all m drafts share the prefix
up to "## Evidence:". The drafter's answer is forced to start with "## Rationale:" so an instruction-tuned
(not fine-tuned) drafter follows the format.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from specrag_jax.pipeline.closed_set import ClosedSet

DRAFT_INSTRUCTION = "Response to the instruction. Also provide rationale for your response."
DRAFT_FORMAT_HINT = (
    "Write '## Rationale:' with a short explanation based on the evidence, then '## Response:' with a short answer."
)
RATIONALE_TAG = "## Rationale:"
RESPONSE_TAG = "## Response:"
REFLECTION_PROMPT = "Do you think the explanation supports the answers? (Yes or No)"
# evidence-aware verification (verifier reads the draft's own passages): is the response grounded in them?
EVIDENCE_REFLECTION_PROMPT = (
    "Is the response a correct answer to the instruction, supported by the evidence? (Yes or No)"
)
EVIDENCE_HEADER = "## Evidence:\n"


def format_document(index: int, doc: dict) -> str:
    """``[i] title\\ntext`` (title line omitted when empty)."""
    title = (doc.get("title") or "").strip()
    text = (doc.get("text") or "").strip()
    return f"[{index}] {title}\n{text}\n" if title else f"[{index}] {text}\n"


def question_text(question: str, closed: ClosedSet | None = None) -> str:
    """The question as every prompt shows it: stripped; a closed-set question's choices/instruction follow it."""
    return question.strip() if closed is None else f"{question.strip()}\n{closed.instruction}"


def _short_answer(closed: ClosedSet | None) -> str:
    return "a short answer" if closed is None else closed.response_hint


def drafter_prefix(question: str, closed: ClosedSet | None = None) -> str:
    """Shared by all drafts: instruction and question, up to the evidence header."""
    return f"{DRAFT_INSTRUCTION}\n## Instruction: {question_text(question, closed)}\n## Evidence:\n"


def drafter_evidence(docs: list[dict], closed: ClosedSet | None = None) -> str:
    """One draft's evidence block (documents numbered from 1) and the format hint (a closed-set question's
    response is its label)."""
    hint = DRAFT_FORMAT_HINT if closed is None else DRAFT_FORMAT_HINT.replace("a short answer", _short_answer(closed))
    return "".join(format_document(i + 1, d) for i, d in enumerate(docs)) + hint


def verifier_prefix(question: str, closed: ClosedSet | None = None) -> str:
    """Verifier context for rho_SC / rho_SR: the question only (no documents)."""
    return f"{DRAFT_INSTRUCTION}\n## Instruction: {question_text(question, closed)}\n"


def evidence_block(docs: list[dict]) -> str:
    """A draft's passages as the evidence-aware verifier reads them (numbered from 1)."""
    return "".join(format_document(i + 1, d) for i, d in enumerate(docs))


def standard_rag_prompt(question: str, docs: list[dict], closed: ClosedSet | None = None) -> str:
    """Standard RAG baseline: every document in one prompt, then the question; the answer follows."""
    evidence = "".join(format_document(i + 1, d) for i, d in enumerate(docs))
    return (
        f"Answer the question using the evidence. Give {_short_answer(closed)}.\n## Evidence:\n{evidence}"
        f"## Question: {question_text(question, closed)}\n## Answer:"
    )


def closed_book_prompt(question: str, closed: ClosedSet | None = None) -> str:
    """Closed-book baseline: the question alone."""
    return (
        f"Answer the question. Give {_short_answer(closed)}.\n## Question: {question_text(question, closed)}\n"
        "## Answer:"
    )


@dataclasses.dataclass(frozen=True)
class ParsedDraft:
    rationale: str
    answer: str
    ok: bool  # False when the draft did not follow the format (it then gets a low score)


_RESPONSE_RE = re.compile(r"#+\s*Response\s*:?", re.IGNORECASE)
_RATIONALE_RE = re.compile(r"#+\s*Rationale\s*:?", re.IGNORECASE)


def parse_draft(text: str) -> ParsedDraft:
    """Split a drafter continuation (which starts after "## Rationale:") into rationale and answer."""
    body = _RATIONALE_RE.sub("", text, count=1) if _RATIONALE_RE.match(text.lstrip()) else text
    match = _RESPONSE_RE.search(body)
    if not match:
        return ParsedDraft(rationale=body.strip(), answer=first_line(body), ok=False)
    rationale = body[: match.start()].strip()
    answer = first_line(body[match.end() :])
    return ParsedDraft(rationale=rationale, answer=answer, ok=bool(answer and rationale))


def first_line(text: str) -> str:
    """The first non-empty line, without surrounding whitespace or a trailing '##' section."""
    for line in text.strip().splitlines():
        line = line.split("##")[0].strip()
        if line:
            return line
    return ""


def normalize_answer(answer: str) -> str:
    """Lower-case, no punctuation or articles: for the consensus check."""
    text = re.sub(r"[^\w\s]", " ", answer.lower())
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def occurs_in_passages(answer: str, docs: Sequence[dict]) -> bool:
    """Whether ``answer`` occurs (``normalize_answer``, on word boundaries) in the titles or texts of ``docs``."""
    norm = normalize_answer(answer)
    body = " ".join(normalize_answer(f"{d.get('title') or ''} {d.get('text') or ''}") for d in docs)
    return bool(norm) and f" {norm} " in f" {body} "
