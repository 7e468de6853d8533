"""The judging prompt, document first so that its K/V is a reusable prefix (HyperRAG).

``[judging instruction + document][question + QUESTION_PROMPT + answer cue]``: the first part's tokens (and
so its K/V) depend only on the document, the second only on the question. The two parts are tokenized
separately and concatenated, in both reranking modes, so stored and recomputed prefixes see the same ids.

Plain form (base models)::

    {INSTRUCTION}\\n\\n## Document:\\n{title}\\n{text}   |   \\n\\n## Question: {question}\\n{QUESTION_PROMPT}\\nAnswer:

Chat form (instruction-tuned models): the same words as one user turn rendered by the model's template with
the generation prompt; the template is rendered once with sentinels in place of document and question and
split there, so the document part is a prefix of every rendering and nothing after it depends on the
document.

Score = log P(yes) - log P(no) at the last position, each side a log-sum-exp over the single-token variants
``" yes" " Yes" "yes" "Yes"`` (``no`` alike): after ``Answer:`` a model writes ``" yes"``, as the first
word of a chat reply ``"Yes"``, and summing the spellings keeps the score independent of which one a model
prefers. A tokenizer that spells none of them as one token (a character tokenizer) uses the first token of
``"yes"``/``"Yes"``; yes and no ids must differ.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer.base import Tokenizer

INSTRUCTION = (
    'Judge whether the document below answers the question that follows it. The answer can only be "yes" or "no".'
)
QUESTION_PROMPT = "Does the document answer the question? (yes or no)"
PROMPT_FORMS = ("auto", "chat", "plain")
_DOC = "\u2063SPECRAG_DOCUMENT\u2063"
_QUESTION = "\u2063SPECRAG_QUESTION\u2063"
_YES = (" yes", " Yes", "yes", "Yes")
_NO = (" no", " No", "no", "No")


def doc_body(doc: dict) -> str:
    """Title, newline, text (either may be empty); a one-line error for a malformed document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("text", ""), str):
        raise SpecRagError(f"a document must be a dict with a 'text' string (got {type(doc).__name__})")
    title, text = doc.get("title") or "", doc.get("text") or ""
    if not isinstance(title, str):
        raise SpecRagError("a document's 'title' must be a string")
    return f"{title}\n{text}" if title and text else (title or text)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _first_ids(tok: Tokenizer, variants: tuple[str, ...]) -> list[int]:
    single = [ids[0] for ids in (tok.encode(v, add_bos=False) for v in variants) if len(ids) == 1]
    if not single:
        single = [tok.encode(v, add_bos=False)[0] for v in variants if not v.startswith(" ")]
    return sorted(set(single))


@dataclasses.dataclass(frozen=True)
class JudgePrompt:
    """Renders a model's judging prompt parts as token ids."""

    tokenizer: Tokenizer
    chat: bool
    max_doc_tokens: int
    head: str  # text before the document (instruction; chat: the template's start)
    middle: str  # text between document and question
    tail: str  # text after the question (question prompt + answer cue)
    yes_ids: tuple[int, ...]
    no_ids: tuple[int, ...]

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer, *, chat: bool, max_doc_tokens: int) -> "JudgePrompt":
        if max_doc_tokens < 1:
            raise SpecRagError(f"max_doc_tokens must be >= 1 (got {max_doc_tokens})")
        if chat and not tok.chat_template:
            raise SpecRagError("the reranker has no chat template; use prompt form 'plain'")

        def render(doc: str, question: str) -> str:
            plain = f"{INSTRUCTION}\n\n## Document:\n{doc}\n\n## Question: {question}\n{QUESTION_PROMPT}"
            if not chat:
                return plain + "\nAnswer:"
            return tok.apply_chat_template([{"role": "user", "content": plain}], add_generation_prompt=True)

        text = render(_DOC, _QUESTION)
        probe = ("a probe document.", "a probe question?")
        if (
            text.count(_DOC) != 1
            or text.count(_QUESTION) != 1
            or text.index(_DOC) > text.index(_QUESTION)
            or text.replace(_DOC, probe[0]).replace(_QUESTION, probe[1]) != render(*probe)
        ):
            raise SpecRagError(
                "the reranker's chat template does not render a user turn verbatim; use prompt form 'plain'"
            )
        head, rest = text.split(_DOC)
        middle, tail = rest.split(_QUESTION)
        yes, no = _first_ids(tok, _YES), _first_ids(tok, _NO)
        if not yes or not no or set(yes) & set(no):
            raise SpecRagError("the reranker's tokenizer does not tell 'yes' from 'no' by their first token")
        return cls(tok, chat, max_doc_tokens, head, middle, tail, tuple(yes), tuple(no))

    def truncated_body(self, doc: dict) -> str:
        """The document's text cut to its first ``max_doc_tokens`` tokens (decoded back to text)."""
        body = doc_body(doc)
        ids = self.tokenizer.encode(body, add_bos=False)
        return body if len(ids) <= self.max_doc_tokens else self.tokenizer.decode(ids[: self.max_doc_tokens])

    def doc_ids(self, doc: dict) -> list[int]:
        """Token ids of the document part (BOS included per the tokenizer): the reusable prefix."""
        text = self.head + self.truncated_body(doc)
        if self.chat:
            return self.tokenizer.encode_rendered(text)
        return self.tokenizer.encode(text, add_bos=self.tokenizer.add_bos_default)

    def query_ids(self, question: str) -> list[int]:
        """Token ids of the question part; the score is read at its last token."""
        if not isinstance(question, str) or not question.strip():
            raise SpecRagError("the reranker needs a non-empty question")
        return self.tokenizer.encode(self.middle + question.strip() + self.tail, add_bos=False)

    @property
    def targets(self) -> list[int]:
        """The ids whose log-probabilities a judged pair needs at its last position: yes spellings, then no."""
        return list(self.yes_ids) + list(self.no_ids)

    def scores(self, logprobs) -> list[float]:
        """log P(yes) - log P(no) per pair from ``logprobs`` [pairs, len(targets)] (log-sum-exp per side)."""
        lp = np.asarray(logprobs, dtype=np.float64).reshape(-1, len(self.targets))
        lse = lambda a: np.log(np.exp(a - a.max(1, keepdims=True)).sum(1)) + a.max(1)  # noqa: E731
        ny = len(self.yes_ids)
        return (lse(lp[:, :ny]) - lse(lp[:, ny:])).tolist()

    def fingerprint(self) -> str:
        """Hash of everything but the document that shapes the prefix (form, template text, token limit)."""
        return text_hash(repr((self.chat, self.head, self.max_doc_tokens)))[:16]


def use_chat(form: str, instruct: bool) -> bool:
    """Whether the judging prompt goes through the chat template (``auto``: when the model is instruction-tuned)."""
    if form not in PROMPT_FORMS:
        raise SpecRagError(f"reranker prompt form must be one of {', '.join(PROMPT_FORMS)} (got {form!r})")
    return form == "chat" or (form == "auto" and instruct)
