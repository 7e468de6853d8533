"""Rerank and selection flags of ask/eval/serve: one-line errors, and `specrag eval --corpus` end to end on tiny
models."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specrag_jax.cli import main
from specrag_jax.retrieval.pooling import pool_file

DATA = Path(__file__).parent / "pipeline" / "data" / "mini_eval.jsonl"
TINY = ["--drafter", "tiny:llama", "--verifier", "tiny:llama"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rerank", "bm25"], "unknown rerank mode 'bm25'; choose one of none, kv, recompute"),
        (["--rerank", "kv", "--n-coarse", "0"], "n_coarse (candidates to rerank) must be >= 1"),
        (["--rerank", "kv", "--rerank-group", "0"], "rerank group size must be >= 1"),
        (["--rerank", "kv", "--rerank-patience", "0"], "rerank patience must be >= 1"),
        (["--rerank", "kv", "--rerank-patience", "soon"], "--rerank-patience must be a whole number >= 1 or 'inf'"),
        (["--reranker", " "], "reranker must be a model name"),
        (["--selection", "vote"], "unknown selection 'vote'; choose one of rho, evidence, rho+agg, evidence+agg, rho+"),
        (["--tau-min", "1.5"], "tau_min must be in [0, 1] (got 1.5)"),
        (["--tau-min", "-0.1"], "tau_min must be in [0, 1] (got -0.1)"),
        (["--clustering", "bert"], "unknown clustering 'bert'; choose one of drafter, lexical"),
    ],
)
@pytest.mark.parametrize("command", ["ask", "eval", "serve"])
def test_bad_rerank_flags_are_one_line(capsys, command, flags, message):
    head = {
        "ask": ["ask", "What is Python?"],
        "eval": ["eval", "--data", str(DATA)],
        "serve": ["serve", "--compile-cache", "none"] + TINY,
    }[command]
    assert main(head + flags + ["-q"] * (command != "serve")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specrag: error: ") and message in err[0], err


def test_eval_corpus_must_exist(capsys):
    assert main(["eval", "--data", str(DATA), "--corpus", "/nonexistent/corpus.jsonl", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corpus not found" in err[0]


class WordOverlap:
    def score(self, question, docs):
        words = set(re.findall(r"\w+", question.lower()))
        return [float(len(words & set(re.findall(r"\w+", d["text"].lower())))) for d in docs]


@pytest.fixture
def tiny_factory(monkeypatch):
    """build_specrag on tiny models (any name) with a fake reranker."""
    from specrag_jax.pipeline import factory
    from specrag_jax.serving.tiny import tiny_text_model

    class Loader:
        @staticmethod
        def load(name, **_):
            return tiny_text_model("tiny:llama", seed=1, num_pages=96, page_size=16, max_seq_len=1024)

    monkeypatch.setattr(factory, "TextModel", Loader)
    monkeypatch.setattr(factory, "build_reranker", lambda config, model, kv_dir=None: WordOverlap())


def test_eval_from_a_pooled_corpus_with_reranking(capsys, tmp_path, tiny_factory):
    corpus = tmp_path / "corpus.jsonl"
    assert pool_file(DATA, corpus) == 5
    code = main(
        [
            "eval",
            "--data",
            str(DATA),
            "--corpus",
            str(corpus),
            "--methods",
            "closed_book,standard",
            "--n-docs",
            "2",
            "--m",
            "1",
            "--k",
            "1",
            "--rerank",
            "kv",
            "--n-coarse",
            "4",
            "--rerank-group",
            "1",
            "--rerank-patience",
            "1",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    res = json.loads(out)
    cfg = res["config"]
    assert (
        cfg["rerank"],
        cfg["reranker"],
        cfg["n_coarse"],
        cfg["rerank_group"],
        cfg["rerank_patience"],
        cfg["corpus"],
    ) == ("kv", None, 4, 1, 1, str(corpus))
    std = res["methods"]["standard"]
    assert 0.0 < std["recall_own_passages"] <= 1.0 and "recall_own_passages" not in res["methods"]["closed_book"]
    assert std["rerank"]["questions"] == 2 and 0.0 <= std["rerank"]["saved_fraction"] < 1.0
    assert std["stages_s"]["rerank_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["kv", "recompute"])
def test_eval_corpus_rerank_with_the_real_reranker(capsys, tmp_path, monkeypatch, mode):
    from specrag_jax.rerank import kv_store

    monkeypatch.setattr(kv_store, "default_store_dir", lambda: tmp_path / "default_doc_kv")  # never used
    corpus = tmp_path / "corpus.jsonl"
    pool_file(DATA, corpus)
    smol = "smollm2-135m-instruct"
    code = main(
        [
            "eval",
            "--data",
            str(DATA),
            "--corpus",
            str(corpus),
            "--methods",
            "standard",
            "--drafter",
            smol,
            "--verifier",
            smol,
            "--n-docs",
            "2",
            "--m",
            "1",
            "--k",
            "1",
            "--rerank",
            mode,
            "--n-coarse",
            "4",
            "--rerank-group",
            "2",
            "--kv-store",
            str(tmp_path / "doc_kv"),
            "--json",
            "-q",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    std = json.loads(out)["methods"]["standard"]
    assert std["recall_own_passages"] > 0 and std["rerank"]["groups_scored"] >= 1
    assert any((tmp_path / "doc_kv").rglob("*.safetensors")) == (mode == "kv")  # --kv-store took the entries
    assert not (tmp_path / "default_doc_kv").exists()


@pytest.mark.parametrize("command", ["ask", "eval"])
def test_progressive_prefill_runs_in_ask_and_eval(capsys, tmp_path, tiny_factory, command):
    corpus = tmp_path / "corpus.jsonl"
    pool_file(DATA, corpus)
    head = ["ask", "What is the capital of France?", "--method", "standard"]
    if command == "eval":
        head = ["eval", "--data", str(DATA), "--methods", "standard"]
    flags = ["--corpus", str(corpus), "--n-docs", "2", "--m", "1", "--k", "1", "--rerank", "kv", "--n-coarse", "5"]
    flags += ["--rerank-group", "1", "--rerank-patience", "3", "--progressive-prefill", "--json", "-q"]
    code = main(head + flags)
    out, err = capsys.readouterr()
    assert code == 0, err
    res = json.loads(out)
    if command == "ask":  # the trace of a question answered on started engines with a prefix cache
        info = res["trace"]["progressive"]
        assert info["trigger_stable_groups"] == 1 and not info["notes"], info
        assert res["trace"]["rerank"]["groups_scored"] >= 1 and res["answer"]
    else:
        assert res["config"]["progressive_prefill"] == 1
        assert res["methods"]["standard"]["rerank"]["questions"] == 2


def test_recompute_beside_started_engines_is_refused_before_loading(capsys):
    for flags in (["--progressive-prefill"], ["--concurrency", "2"]):
        assert main(["eval", "--data", str(DATA), "--rerank", "recompute", "-q"] + flags) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--rerank recompute on the drafter would run its model beside" in err[0], err
