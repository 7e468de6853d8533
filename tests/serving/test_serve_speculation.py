"""Speculation when serving: the ``--speculative`` / ``--spec-budget`` flags and chat completions over HTTP with
token trees, equal to plain decoding (the engine's own speculation tests: ``tests/models/engine``)."""

from __future__ import annotations

import argparse
import json

import pytest
from fastapi.testclient import TestClient

from specrag_jax.errors import SpecRagError
from specrag_jax.serving.app import create_app


def _serve_args(*flags: str) -> argparse.Namespace:
    from specrag_jax.serving.cli import add_serve_parser

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", "--drafter", "tiny:llama", "--verifier", "tiny:llama", *flags])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--speculative", "drafts"], "unknown proposer 'drafts' for --speculative"),
        (["--speculative", "ngram", "--spec-budget", "12"], "tree budget must be one of 8, 16, 32, 64"),
    ],
)
def test_speculative_flag_errors_are_one_line(flags, message, capsys, monkeypatch):
    from specrag_jax.cli import main

    monkeypatch.setattr("specrag_jax.cli.enable_compilation_cache", lambda: None)

    assert main(["serve", "--compile-cache", "none", "--drafter", "tiny:llama", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_model_that_cannot_speculate_is_refused():
    from specrag_jax.serving.cli import build_service

    with pytest.raises(SpecRagError, match="cannot speculate: its context of 8 tokens"):
        build_service(_serve_args("--speculative", "ngram", "--max-seq-len", "8"))
    assert build_service(_serve_args("--max-seq-len", "8")).speculation() is None


def test_http_chat_completion_with_speculation_equals_without(make_service):
    body = {"messages": [{"role": "user", "content": "abcabcabc abcabc"}], "max_tokens": 24}
    out = {}
    for spec in ("none", "ngram"):
        with TestClient(create_app(make_service(speculative=spec))) as c:
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            streamed = c.post("/v1/chat/completions", json={**body, "stream": True}).text
            out[spec] = (r.json(), streamed)
    plain, spec = out["none"][0], out["ngram"][0]
    assert spec["choices"] == plain["choices"]
    assert "speculation" in spec["usage"] and spec["usage"]["speculation"]["steps"] > 0
    assert "speculation" not in plain["usage"]

    def text(s):
        return "".join(
            json.loads(x[6:])["choices"][0]["delta"].get("content", "")
            for x in s.split("\n\n")
            if x.startswith("data: {")
        )

    assert text(out["ngram"][1]) == text(out["none"][1]) == plain["choices"][0]["message"]["content"]
