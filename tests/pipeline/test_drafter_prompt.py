"""The drafter's prompt ids: exactly one BOS whether the chat template writes it (Gemma) or not (SmolLM2).

Gemma's template starts with ``{{ bos_token }}``; encoding that text with ``add_bos`` as well gave every
Gemma drafter prompt (and every training example replayed for it) two BOS tokens, which Gemma models read as
a different, out-of-distribution prompt.
"""

from __future__ import annotations

import pytest

from specrag_jax.models.tokenizer.load import load_tokenizer
from specrag_jax.pipeline.drafting import split_chat_prompt
from specrag_jax.serving.openai_api import chat_prompt
from specrag_jax.serving.tiny import tiny_text_model

PREFIX = "## Instruction: Who wrote Hamlet?\n## Evidence:\n"
SUFFIX = "[1] Hamlet is a play by Shakespeare."


def _model_with(tokenizer_name: str | None):
    model = tiny_text_model("tiny:llama")  # only its tokenizer is read
    if tokenizer_name is not None:
        model.tokenizer = load_tokenizer(tokenizer_name)
    return model


@pytest.mark.slow
def test_gemma_template_bos_is_not_doubled():
    model = _model_with("gemma3-270m")
    tok = model.tokenizer
    head, tail = split_chat_prompt(model, PREFIX, SUFFIX)
    assert head[0] == tok.bos_id and head.count(tok.bos_id) == 1
    assert tok.decode(head, skip_special=False).startswith("<bos><start_of_turn>user\n## Instruction:")
    assert tok.bos_id not in tail
    ids = chat_prompt(model, [{"role": "user", "content": "Hi"}])
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1


@pytest.mark.slow
def test_template_without_bos_keeps_the_tokenizers_rule():
    model = _model_with("smollm2-135m-instruct")
    tok = model.tokenizer
    assert not tok.add_bos_default
    head, _ = split_chat_prompt(model, PREFIX, SUFFIX)
    assert tok.decode(head[:1], skip_special=False) == "<|im_start|>"


def test_no_template_adds_bos_once():
    model = _model_with(None)
    tok = model.tokenizer
    assert tok.chat_template is None and tok.add_bos_default
    head, tail = split_chat_prompt(model, PREFIX, SUFFIX)
    assert head[0] == tok.bos_id and head.count(tok.bos_id) == 1 and tok.bos_id not in tail
