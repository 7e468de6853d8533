"""Lossless mode in the pipeline (real SmolLM2 as drafter and verifier): the same answer as standard RAG,
token for token, in fewer verifier steps; the cascade's fallback through the lossless path; bad settings (the
eval JSON's ``speculation`` contract is checked in test_eval_cli.py, on its shared run)."""

from __future__ import annotations

import argparse
import json

import pytest

from specrag_jax.cli import main
from specrag_jax.errors import SpecRagError
from specrag_jax.models.speculative.decode import Speculation
from specrag_jax.models.speculative.tree import default_tree_budget
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.lossless import draft_token_streams, lossless_speculation
from specrag_jax.pipeline.rag_cli import add_rag_options, rag_config_from_args
from specrag_jax.pipeline.specrag import RAGConfig
from specrag_jax.serving.service import ServeConfig

SMOL = "smollm2-135m-instruct"
DOCS = [
    {"id": "a", "title": "Paris", "text": "Paris is the capital and largest city of France. It lies on the Seine."},
    {"id": "b", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine."},
    {"id": "c", "title": "Berlin", "text": "Berlin is the capital of Germany."},
]


@pytest.fixture(scope="module")
def rag():
    from specrag_jax.pipeline.factory import build_specrag

    return build_specrag(SMOL, SMOL, None, RAGConfig(m=2, max_answer_tokens=24), max_seq_len=1024)


@pytest.mark.slow
@pytest.mark.parametrize("proposer", ["ngram", "drafts", "both"])
def test_lossless_equals_standard_token_for_token(rag, proposer):
    rag.config.proposer = proposer
    for q in ["What is the capital of France?", "Which river does Paris lie on?", "What is Lyon known for?"]:
        out = rag.answer_methods(q, DOCS, ["standard", "lossless"])
        assert out["lossless"].answer == out["standard"].answer
        spec = out["lossless"].trace["speculation"]
        assert spec["steps"] >= 1 and spec["accepted_tokens_per_step"] >= 1.0
        assert out["lossless"].trace["verifier_decode_tokens"] == out["standard"].trace["verifier_decode_tokens"]
        assert bool(out["lossless"].drafts) == (proposer != "ngram")  # ngram alone needs no drafts
    assert rag.verifier.runner.allocator.num_free == rag.verifier.runner.allocator.num_usable
    rag.config.proposer = "both"


@pytest.mark.slow
def test_cascade_fallback_regenerates_through_the_lossless_path(rag):
    rag.config.tau_min, rag.config.consensus = 1.0, False  # every answer falls back
    try:
        out = rag.answer_methods("What is the capital of France?", DOCS, ["speculative", "standard"])
    finally:
        rag.config.tau_min, rag.config.consensus = None, True
    trace = out["speculative"].trace
    assert trace["path"] == "fallback" and trace["fallback"] == "standard"
    assert trace["speculation"]["steps"] >= 1
    assert out["speculative"].answer == out["standard"].answer
    verified = rag.answer_methods("What is the capital of France?", DOCS, ["speculative"])["speculative"]
    assert verified.trace["path"] in ("consensus", "verified_draft")


@pytest.mark.slow
def test_ask_lossless_json(capsys):
    """The CLI's lossless answer as JSON. n-gram proposals only: no drafting to compile (the drafts as proposals
    go through the CLI in the eval contract's run, ``smol_eval``, and through the pipeline above)."""
    code = main(
        [
            "ask",
            "What is the capital of France?",
            "--method",
            "lossless",
            "--proposer",
            "ngram",
            "--drafter",
            SMOL,
            "--verifier",
            SMOL,
            "--json",
            "-q",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    obj = json.loads(out)
    assert obj["method"] == "lossless" and obj["trace"]["speculation"]["steps"] >= 1
    assert not [key for key in obj["trace"] if key.startswith("draft")]  # n-gram proposals need no drafts


@pytest.mark.parametrize(
    "args, message",
    [
        (["--proposer", "medusa"], "unknown proposer 'medusa'"),
        (["--spec-budget", "12"], "tree budget must be one of 8, 16, 32, 64"),
        (["--method", "lossy"], "unknown method 'lossy'"),
    ],
)
def test_bad_lossless_settings_are_one_line_errors(capsys, args, message):
    assert main(["ask", "What is the capital of France?"] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_config_checks_proposer_and_budget():
    with pytest.raises(SpecRagError, match="unknown proposer"):
        RAGConfig(proposer="x").check()
    with pytest.raises(SpecRagError, match="tree budget"):
        RAGConfig(tree_budget=100).check()


@pytest.mark.parametrize("flags, budget", [([], None), (["--spec-budget", "16"], 16)])
def test_tree_budget_defaults_to_the_platforms(flags, budget):
    """No --spec-budget: the platform's (8 on CPU), what ``specrag ask`` / ``eval`` and the server's RAG run."""
    default = default_tree_budget()
    p = argparse.ArgumentParser()
    add_rag_options(p)
    assert rag_config_from_args(p.parse_args(flags)).tree_budget == (budget or default)
    assert RAGConfig().tree_budget == default and ServeConfig().spec_budget == default
    assert lossless_speculation(_WordTokenizer(), []).max_budget == default == Speculation(lambda c: []).max_budget


class _WordTokenizer:
    """Whitespace 'tokenizer': one id per distinct word (leading-space variants are their own words)."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        words = text.split(" ")
        return [
            self.vocab.setdefault(("▁" if i or text.startswith(" ") else "") + w, len(self.vocab))
            for i, w in enumerate(words)
            if w
        ]


def test_draft_streams_and_proposals_follow_the_drafts():
    tok = _WordTokenizer()
    drafts = [
        Draft(0, ["a"], "", "Paris is the capital of France.", "Paris", True, -1.0, 3),
        Draft(1, ["b"], "", "", "Lyon", True, -1.0, 3),
    ]
    streams = draft_token_streams(tok, drafts)
    assert len(streams) == 6  # answer and rationale of draft 0, answer of draft 1, each with and without a space
    spec = lossless_speculation(tok, drafts, "drafts", 8)
    context = tok.encode("Paris is the")
    proposals = spec.proposer_for(0)(context)
    assert tok.encode("Paris is the capital of France.")[3:] in proposals  # "capital of France." follows
