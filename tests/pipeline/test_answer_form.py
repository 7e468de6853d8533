"""The answer's form: a reply up to the verifier's end of turn ("turn", the default of ask / the API / the server)
with a budget that is a cap, or its first line ("line", the paper's short answers that eval keeps); the answer
streamed as it is decoded (``TextModel.generate_ids(on_text=...)``, ``SpecRAG.answer(on_text=...)``)."""

from __future__ import annotations

import argparse

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.answer_stream import AnswerStream
from specrag_jax.pipeline.lossless import lossless_speculation
from specrag_jax.pipeline.rag_cli import add_rag_options, rag_config_from_args
from specrag_jax.pipeline.rag_config import DEFAULT_ANSWER_TOKENS, PAPER_ANSWER_TOKENS, RAGConfig
from specrag_jax.serving.tiny import tiny_text_model

SMOL = "smollm2-135m-instruct"
DOCS = [
    {"id": "a", "title": "Paris", "text": "Paris is the capital and largest city of France. It lies on the Seine."},
    {"id": "b", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine."},
]


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("max_answer_tokens", 0, "max_answer_tokens must be >= 1"),
        ("max_draft_answer_tokens", 0, "max_draft_answer_tokens must be >= 1"),
        ("answer_stop", "sentence", "answer_stop must be one of turn, line"),
    ],
)
def test_bad_answer_settings_are_one_line_errors(field, value, needle):
    with pytest.raises(SpecRagError, match=needle) as err:
        RAGConfig(**{field: value}).check()
    assert "\n" not in str(err.value)


def test_ask_and_eval_defaults():
    parser = argparse.ArgumentParser()
    add_rag_options(parser)
    cfg = rag_config_from_args(parser.parse_args([]))
    assert (cfg.max_answer_tokens, cfg.answer_stop) == (DEFAULT_ANSWER_TOKENS, "turn")
    cfg = rag_config_from_args(parser.parse_args(["--answer-stop", "line", "--max-answer-tokens", "32"]))
    assert (cfg.max_answer_tokens, cfg.answer_stop) == (32, "line")
    from specrag_jax.cli import build_parser

    args = build_parser().parse_args(["eval", "--data", "x.jsonl"])
    assert (args.max_answer_tokens, args.answer_stop) == (PAPER_ANSWER_TOKENS, "line")


def test_answer_stream_drops_leading_space_and_keeps_one_line():
    got: list[str] = []
    line = AnswerStream(got.append, line=True)
    for piece in ["  ", " Paris", " is it.\nMore", " text"]:
        line.push(0, piece)
    assert line.sent == "Paris is it." and "".join(got) == line.sent
    whole = AnswerStream(got.append, line=False)
    for piece in ["\n", "Paris\n", "\nand more."]:
        whole.push(0, piece)
    assert whole.sent == "Paris\n\nand more."


@pytest.mark.parametrize("speculate", [False, True])
def test_generate_ids_streams_the_text_it_returns(speculate):
    model = tiny_text_model("tiny:llama", seed=3)
    prompts = [model.tokenizer.encode("hello there", add_bos=True), model.tokenizer.encode("abc", add_bos=True)]
    pieces: dict[int, list[str]] = {0: [], 1: []}
    spec = lossless_speculation(model.tokenizer, [], "ngram", 8) if speculate else None
    results = model.generate_ids(
        prompts, max_new_tokens=12, speculation=spec, on_text=lambda row, text: pieces[row].append(text)
    )
    for row, res in enumerate(results):
        assert "".join(pieces[row]) == res.text
    assert model.runner.allocator.num_free == model.runner.allocator.num_usable


@pytest.fixture(scope="module")
def rag():
    from specrag_jax.pipeline.factory import build_specrag

    return build_specrag(SMOL, SMOL, None, RAGConfig(m=2, max_answer_tokens=48), max_seq_len=1024)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["standard", "auto", "lossless"])
def test_the_streamed_answer_is_the_answer(rag, method):
    pieces: list[str] = []
    out = rag.answer("What is the capital of France?", DOCS, method, on_text=pieces.append)
    assert pieces and "".join(pieces).strip() == out.answer
    assert out.trace["answer_cut"] == (out.trace["verifier_decode_tokens"] >= 48 and not out.answer.endswith("."))
    assert rag.verifier.runner.allocator.num_free == rag.verifier.runner.allocator.num_usable


@pytest.mark.slow
def test_line_answers_are_the_first_line_and_turn_answers_run_on(rag):
    rag.config.answer_stop = "line"
    try:
        line = rag.answer("What is the capital of France?", DOCS, "standard")
    finally:
        rag.config.answer_stop = "turn"
    turn = rag.answer("What is the capital of France?", DOCS, "standard")
    assert "\n" not in line.answer and turn.answer.startswith(line.answer)
    assert turn.trace["verifier_decode_tokens"] >= line.trace["verifier_decode_tokens"]


@pytest.mark.slow
def test_a_turn_answer_gets_the_room_the_context_has(rag):
    """A budget beyond the room the prompt leaves in the context (1024 tokens here) is a cap: the answer gets the
    room, where a plain generation with that many new tokens is refused."""
    rag.config.max_answer_tokens = 4096
    try:
        out = rag.answer("What is the capital of France?", DOCS, "standard")
    finally:
        rag.config.max_answer_tokens = 48
    assert out.answer and out.trace["verifier_prefill_tokens"] + out.trace["verifier_decode_tokens"] <= 1024
    with pytest.raises(SpecRagError, match="exceeds the context of 1024 tokens"):
        rag.verifier.generate_ids([[1, 2, 3]], max_new_tokens=4096)
