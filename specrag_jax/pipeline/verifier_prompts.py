"""What the verifier reads: the plain prompts of a base model, or the same text through a chat template.

A base model (Gemma 3 270M) continues plain text: "... ## Answer:" for standard RAG and closed book, and
``[question][## Rationale: r ## Response: a][reflection prompt + "Answer:"][" Yes"]`` for scoring. An
instruction-tuned model (Qwen2.5-Instruct) gets the same words as chat turns rendered by its own template:
the evidence and question as the user turn (the answer is the assistant turn), and for scoring the
question as the user turn, the draft as the assistant's reply, the reflection prompt as a second user turn
and "Yes"/"No" as the first word of the second reply. Which form a model gets: ``RAGConfig.verifier_prompt``
("auto" = chat when the model is instruction-tuned, see ``registry.instruction_tuned``).
"""

from __future__ import annotations

import dataclasses

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer.base import Tokenizer
from specrag_jax.pipeline.closed_set import ClosedSet
from specrag_jax.pipeline.prompts import (
    EVIDENCE_HEADER,
    EVIDENCE_REFLECTION_PROMPT,
    REFLECTION_PROMPT,
    closed_book_prompt,
    standard_rag_prompt,
    verifier_prefix,
)

PROMPT_FORMS = ("auto", "chat", "plain")
_SENTINEL = "\u2063SPECRAG_DRAFT\u2063"  # invisible separator: survives templates that trim or escape
_EVIDENCE = "\u2063SPECRAG_EVIDENCE\u2063"


@dataclasses.dataclass(frozen=True)
class ScoringPrompt:
    """Text around every draft in the verification tree: prefix (shared, cached), then per draft
    ``RATIONALE_TAG r RESPONSE_TAG a`` + ``after`` + the scored ``yes`` token (``no`` is its rival)."""

    prefix: str
    after: str
    yes: str
    no: str
    before_draft: str = ""  # evidence-aware form: text between a branch's passages and its draft


def check_prompt_form(form: str) -> str:
    """``form`` if it is one of PROMPT_FORMS, else a one-line error."""
    if form not in PROMPT_FORMS:
        raise SpecRagError(f"verifier prompt form must be one of {', '.join(PROMPT_FORMS)} (got {form!r})")
    return form


def use_chat(form: str, instruct: bool) -> bool:
    """Whether the verifier's prompts go through its chat template."""
    return check_prompt_form(form) == "chat" or (form == "auto" and instruct)


def _chat(tok: Tokenizer, messages: list[dict]) -> str:
    if not tok.chat_template:
        raise SpecRagError("the verifier has no chat template; use verifier_prompt='plain'")
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def answer_prompt(tok: Tokenizer, question: str, docs: list[dict], chat: bool, closed: ClosedSet | None = None) -> str:
    """Standard RAG (docs given) or closed-book prompt text; with ``chat`` rendered as one user turn (``closed``:
    a closed-set question's choices/instruction, see closed_set)."""
    text = standard_rag_prompt(question, docs, closed) if docs else closed_book_prompt(question, closed)
    if not chat:
        return text
    user = text.removesuffix("## Answer:").rstrip()
    return _chat(tok, [{"role": "user", "content": user}])


def scoring_prompt(tok: Tokenizer, question: str, chat: bool, closed: ClosedSet | None = None) -> ScoringPrompt:
    """The verification tree's shared prefix and per-draft suffix, plain or through the chat template."""
    if not chat:
        return ScoringPrompt(verifier_prefix(question, closed), "\n" + REFLECTION_PROMPT + "\nAnswer:", " Yes", " No")
    text = _chat(
        tok,
        [
            {"role": "user", "content": verifier_prefix(question, closed).rstrip()},
            {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": REFLECTION_PROMPT},
        ],
    )
    if text.count(_SENTINEL) != 1:
        raise SpecRagError(
            "the verifier's chat template does not render an assistant turn verbatim; use verifier_prompt='plain'"
        )
    prefix, after = text.split(_SENTINEL)
    return ScoringPrompt(prefix, after, "Yes", "No")


def evidence_scoring_prompt(
    tok: Tokenizer, question: str, chat: bool, closed: ClosedSet | None = None
) -> ScoringPrompt:
    """Evidence-aware verification: the shared prefix ends at the evidence header; each branch is
    ``passages`` + ``before_draft`` + the draft + ``after`` (the evidence reflection prompt) + ``yes``."""
    head = verifier_prefix(question, closed) + EVIDENCE_HEADER
    if not chat:
        return ScoringPrompt(head, "\n" + EVIDENCE_REFLECTION_PROMPT + "\nAnswer:", " Yes", " No", before_draft="")
    text = _chat(
        tok,
        [
            {"role": "user", "content": head + _EVIDENCE},
            {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": EVIDENCE_REFLECTION_PROMPT},
        ],
    )
    if text.count(_SENTINEL) != 1 or text.count(_EVIDENCE) != 1 or text.index(_EVIDENCE) > text.index(_SENTINEL):
        raise SpecRagError(
            "the verifier's chat template does not render the evidence and the draft verbatim; "
            "use verifier_prompt='plain'"
        )
    prefix, rest = text.split(_EVIDENCE)
    before, after = rest.split(_SENTINEL)
    return ScoringPrompt(prefix, after, "Yes", "No", before_draft=before)
