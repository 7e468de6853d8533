"""Corpus loading: JSON lines, text folders, non-UTF-8 files, the built-in corpus, question contexts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval import default_corpus, doc_text, docs_from_context, load_corpus

DATA = Path(__file__).parent / "data"


def test_jsonl_objects_and_plain_strings(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [
        json.dumps({"id": "a", "title": "Alpha", "text": "first"}),
        "",
        json.dumps("just a string"),
        json.dumps({"text": "no id or title"}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    docs = load_corpus(path)
    assert docs == [
        {"id": "a", "title": "Alpha", "text": "first"},
        {"id": "3", "title": "", "text": "just a string"},
        {"id": "4", "title": "", "text": "no id or title"},
    ]
    assert doc_text(docs[0]) == "Alpha\nfirst" and doc_text(docs[1]) == "just a string"


def test_folder_of_text_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.md").write_text("# Bees\nBees make honey.\n", encoding="utf-8")
    (tmp_path / "sub" / "a.txt").write_text("single line only", encoding="utf-8")
    (tmp_path / "skip.json").write_text("{}", encoding="utf-8")
    (tmp_path / ".hidden.txt").write_text("hidden", encoding="utf-8")
    docs = load_corpus(tmp_path)
    assert docs == [
        {"id": "b.md", "title": "Bees", "text": "Bees make honey."},
        {"id": "sub/a.txt", "title": "a", "text": "single line only"},
    ]


def test_non_utf8_file_names_file_and_offset(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps({"text": "ok"}).encode() + b"\n" + '"caf\u00e9"'.encode("latin-1") + b"\n")
    with pytest.raises(SpecRagError, match=r"latin1\.jsonl is not UTF-8.*byte offset 19, line 2"):
        load_corpus(path)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "bad.txt").write_bytes(b"\xff\xfe broken")
    with pytest.raises(SpecRagError, match=r"bad\.txt is not UTF-8.*byte offset 0"):
        load_corpus(folder)


def test_empty_and_broken_corpora(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(SpecRagError, match="no documents"):
        load_corpus(empty)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(SpecRagError, match="no documents"):
        load_corpus(tmp_path / "empty_dir")
    with pytest.raises(SpecRagError, match="not found"):
        load_corpus(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{oops\n', encoding="utf-8")
    with pytest.raises(SpecRagError, match="line 2: not valid JSON"):
        load_corpus(bad)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "x", "text": "a"}\n{"id": "x", "text": "b"}\n', encoding="utf-8")
    with pytest.raises(SpecRagError, match="duplicate document id 'x'"):
        load_corpus(dup)


def test_default_corpus_is_python_help_topics():
    docs = default_corpus()
    assert len(docs) > 20
    titles = {d["title"] for d in docs}
    assert {"assert", "if"} <= titles
    assert all(d["text"] for d in docs)
    assert len({d["id"] for d in docs}) == len(docs)


def test_docs_from_context_normalises_every_passage_format():
    rows = [json.loads(line) for line in (DATA / "context_sample.jsonl").read_text(encoding="utf-8").splitlines()]
    wiki = docs_from_context(rows[0]["context"])
    assert wiki[0] == {
        "id": "101",
        "title": "Freedonia",
        "text": "Freedonia is a fictional country whose capital is Fredville.",
        "score": 1.75,
    }
    web = docs_from_context(rows[1]["context"])  # title-only kept, empty passage dropped
    assert [d["id"] for d in web] == ["ctx0", "ctx1"] and web[1] == {
        "id": "ctx1",
        "title": "Cited by View all",
        "text": "",
    }
    plain = docs_from_context(rows[2]["context"])
    assert plain[1] == {"id": "ctx1", "title": "", "text": "On May 4th, Ada has a dentist appointment at 2:00 PM."}
    with pytest.raises(SpecRagError, match="no non-empty passages"):
        docs_from_context([{"title": ""}, "  "])
    with pytest.raises(SpecRagError, match="must be a list"):
        docs_from_context("a single string")
    with pytest.raises(SpecRagError, match="passage 1"):
        docs_from_context(["ok", 42])
