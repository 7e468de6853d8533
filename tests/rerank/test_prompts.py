"""The judging prompt: the document part is a prefix of the whole rendering, plain or through a chat template."""

from __future__ import annotations

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.rerank.prompts import INSTRUCTION, QUESTION_PROMPT, JudgePrompt, use_chat
from specrag_jax.serving.tiny import CharTokenizer

DOC = {"title": "Mill", "text": "The mill stands by the river."}
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _chat_tokenizer(template: str = TEMPLATE) -> CharTokenizer:
    tok = CharTokenizer()
    tok.chat_template = template
    return tok


def test_plain_parts():
    tok = CharTokenizer()
    p = JudgePrompt.for_tokenizer(tok, chat=False, max_doc_tokens=160)
    full = p.doc_ids(DOC) + p.query_ids(" Where is the mill? ")
    text = (
        f"{INSTRUCTION}\n\n## Document:\nMill\nThe mill stands by the river.\n\n## Question: Where is the mill?\n"
        f"{QUESTION_PROMPT}\nAnswer:"
    )
    assert full == tok.encode(text, add_bos=True)
    assert p.yes_ids == tuple(sorted({tok.encode("y")[0], tok.encode("Y")[0]}))  # no single-token " yes" here


def test_chat_parts_reassemble_the_template():
    tok = _chat_tokenizer()
    p = JudgePrompt.for_tokenizer(tok, chat=True, max_doc_tokens=160)
    content = (
        f"{INSTRUCTION}\n\n## Document:\nMill\nThe mill stands by the river.\n\n## Question: Where?\n{QUESTION_PROMPT}"
    )
    rendered = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    assert p.doc_ids(DOC) + p.query_ids("Where?") == tok.encode_rendered(rendered)
    assert p.tail.endswith("<|assistant|>\n")
    other = JudgePrompt.for_tokenizer(tok, chat=False, max_doc_tokens=160)
    assert other.fingerprint() != p.fingerprint()


def test_template_that_rewrites_content_is_refused():
    with pytest.raises(SpecRagError, match="verbatim"):
        JudgePrompt.for_tokenizer(
            _chat_tokenizer(TEMPLATE.replace("m.content", "m.content | upper")), chat=True, max_doc_tokens=160
        )
    with pytest.raises(SpecRagError, match="no chat template"):
        JudgePrompt.for_tokenizer(CharTokenizer(), chat=True, max_doc_tokens=160)


def test_truncation_and_forms():
    p = JudgePrompt.for_tokenizer(CharTokenizer(), chat=False, max_doc_tokens=10)
    assert p.truncated_body({"text": "x" * 50}) == "x" * 10
    assert p.truncated_body({"text": "short"}) == "short"
    assert use_chat("auto", True) and not use_chat("auto", False) and use_chat("chat", False)
    with pytest.raises(SpecRagError, match="prompt form"):
        use_chat("fancy", True)
    with pytest.raises(SpecRagError, match="max_doc_tokens"):
        JudgePrompt.for_tokenizer(CharTokenizer(), chat=False, max_doc_tokens=0)
