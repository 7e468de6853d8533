"""Verifier prompts: plain text for base models, the model's chat template for instruction-tuned ones."""

from __future__ import annotations

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.registry import instruction_tuned
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.prompts import REFLECTION_PROMPT, standard_rag_prompt, verifier_prefix
from specrag_jax.pipeline.specrag import RAGConfig, SpecRAG
from specrag_jax.pipeline.verification import verify_drafts
from specrag_jax.pipeline.verifier_prompts import answer_prompt, scoring_prompt, use_chat
from specrag_jax.serving.tiny import tiny_text_model

CHATML = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
DOCS = [{"id": "a", "title": "Paris", "text": "Paris is in France."}]


@pytest.fixture(scope="module")
def chat_model():
    model = tiny_text_model("tiny:qwen2")
    model.tokenizer.chat_template = CHATML
    model.instruct = True
    return model


def test_which_form():
    assert use_chat("auto", True) and not use_chat("auto", False)
    assert use_chat("chat", False) and not use_chat("plain", True)
    with pytest.raises(SpecRagError, match="verifier prompt form must be one of auto, chat, plain"):
        use_chat("markdown", True)
    with pytest.raises(SpecRagError, match="verifier prompt form"):
        RAGConfig(verifier_prompt="nope").check()


def test_instruction_tuned_names():
    assert instruction_tuned("qwen2.5-coder-1.5b-instruct") and not instruction_tuned("gemma3-270m")
    assert instruction_tuned("/models/Llama-3.2-1B-Instruct-Q4_K_M.gguf")
    assert instruction_tuned("/models/x.gguf", "gemma-3-1b-it") and instruction_tuned("/m/mistral-7b-chat")
    assert not instruction_tuned("/models/Qwen2.5-1.5B-Q4_K_M.gguf", "Qwen2.5 1.5B")
    assert not instruction_tuned("/models/gemma-3-1b-pt.gguf", "edit-model")


def test_plain_form_is_unchanged(chat_model):
    tok = chat_model.tokenizer
    assert answer_prompt(tok, "Q?", DOCS, chat=False) == standard_rag_prompt("Q?", DOCS)
    form = scoring_prompt(tok, "Q?", chat=False)
    assert (form.prefix, form.after, form.yes, form.no) == (
        verifier_prefix("Q?"),
        "\n" + REFLECTION_PROMPT + "\nAnswer:",
        " Yes",
        " No",
    )


def test_chat_form_uses_the_template(chat_model):
    tok = chat_model.tokenizer
    prompt = answer_prompt(tok, "Q?", DOCS, chat=True)
    assert (
        prompt.startswith("<|user|>Answer the question using the evidence.")
        and prompt.endswith("## Question: Q?\n<|assistant|>")
        and "## Answer:" not in prompt
    )
    form = scoring_prompt(tok, "Q?", chat=True)
    assert form.prefix == "<|user|>" + verifier_prefix("Q?").rstrip() + "\n<|assistant|>"
    assert form.after == "\n<|user|>" + REFLECTION_PROMPT + "\n<|assistant|>" and form.yes == "Yes"
    ids = tok.encode_rendered(form.prefix)
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1


@pytest.mark.parametrize(
    "template, words",
    [
        ("{{ raise_exception('no system role') }}", "chat template failed: no system role"),
        ("{% for m in messages %}{{ m['role'] }}{% endfor %}", "does not render an assistant turn verbatim"),
        (None, "has no chat template"),
    ],
)
def test_bad_templates_are_one_line_errors(chat_model, template, words):
    tok = tiny_text_model("tiny:llama").tokenizer
    tok.chat_template = template
    with pytest.raises(SpecRagError, match=words) as err:
        scoring_prompt(tok, "Q?", chat=True)
    assert "\n" not in str(err.value)


def test_chat_verification_and_standard_answer(chat_model):
    drafts = [
        Draft(i, [], "", r, a, True, -1.0, 3)
        for i, (r, a) in enumerate([("Doc 1 says Paris.", "Paris"), ("Lyon.", "Lyon")])
    ]
    trace = verify_drafts(chat_model, "Q?", drafts, chat=True)
    assert trace["verifier_prefix_tokens"] == len(
        chat_model.tokenizer.encode_rendered(scoring_prompt(chat_model.tokenizer, "Q?", True).prefix)
    )
    assert all(d.sr_logprob < 0 and d.sc_tokens > 0 for d in drafts)
    rag = SpecRAG(
        chat_model, chat_model, subsets=lambda q, docs, k, m, s: ([[0]], {}), config=RAGConfig(max_answer_tokens=4)
    )
    result = rag.answer("Q?", docs=DOCS, method="standard")
    want = chat_model.tokenizer.encode_rendered(answer_prompt(chat_model.tokenizer, "Q?", DOCS, True))
    assert result.trace["verifier_prefill_tokens"] == len(want)
    plain = SpecRAG(
        chat_model,
        chat_model,
        subsets=lambda q, docs, k, m, s: ([[0]], {}),
        config=RAGConfig(max_answer_tokens=4, verifier_prompt="plain"),
    )
    assert plain.answer("Q?", docs=DOCS, method="standard").trace["verifier_prefill_tokens"] == len(
        chat_model.tokenizer.encode(standard_rag_prompt("Q?", DOCS), add_bos=True)
    )
