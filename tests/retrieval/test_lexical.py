"""BM25 index: finds the right document, saves and reloads exactly, and writes atomically."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval import LexicalIndex
from specrag_jax.retrieval.lexical import s_stem

DOCS = [
    {"id": "tower", "title": "Eiffel Tower", "text": "A wrought-iron lattice tower in Paris, built for the 1889 fair."},
    {"id": "wall", "title": "Great Wall", "text": "Fortifications built across the northern borders of China."},
    {"id": "bees", "title": "Honey bees", "text": "Bees collect nectar from flowers and make honey in hives."},
    {"id": "python", "title": "Python", "text": "A programming language with readable syntax and batteries included."},
    {"id": "everest", "title": "Mount Everest", "text": "The highest mountain on Earth, in the Himalayas."},
]


@pytest.fixture(scope="module")
def index():
    return LexicalIndex.build(DOCS)


def test_finds_the_right_document(index):
    assert index.search("When was the tower in Paris built?", 3)[0][0] == 0
    assert index.search("which programming language is readable", 1)[0][0] == 3
    hits = index.search("what do bees make from flowers", 5)
    assert hits[0][0] == 2 and all(s > 0 for _, s in hits)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert index.search("hive", 2)[0][0] == 2  # plural "hives" matches via the S-stemmer
    assert index.search("zzz unknown words", 3) == [] and index.search("the of and", 3) == []
    with pytest.raises(SpecRagError, match=">= 1"):
        index.search("bees", 0)


def test_stopwords_option():
    keep = LexicalIndex.build(DOCS, stopwords=None)
    assert keep.search("the", 5) and keep.search("the", 5)[0][1] > 0
    assert LexicalIndex.build(DOCS).search("the", 5) == []
    with pytest.raises(SpecRagError, match="unknown stop-word list"):
        LexicalIndex.build(DOCS, stopwords="klingon")


def test_s_stemmer():
    assert [s_stem(w) for w in ["flies", "horses", "bees", "glass", "virus", "cats", "is"]] == [
        "fly",
        "horse",
        "bee",
        "glass",
        "virus",
        "cat",
        "is",
    ]


def test_save_and_reload_are_equal(index, tmp_path):
    path = index.save(tmp_path / "idx")
    loaded = LexicalIndex.load(path)
    assert loaded.docs == index.docs and loaded.stopwords == "en"
    assert LexicalIndex.load(LexicalIndex.build(DOCS, stopwords=None).save(tmp_path / "k")).stopwords is None
    for q in ["tower Paris", "honey", "highest mountain Himalayas", "China borders"]:
        np.testing.assert_allclose(loaded.scores(q), index.scores(q), rtol=1e-6)
        assert loaded.search(q, 3) == index.search(q, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "k"]  # no temp or aside dirs left behind


def test_failed_write_leaves_old_index_intact(index, tmp_path, monkeypatch):
    path = tmp_path / "idx"
    LexicalIndex.build(DOCS[:2]).save(path)
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}

    import specrag_jax.retrieval.lexical as lexical

    def crash(docs, dest):  # fails after the BM25 arrays were written into the temp dir
        dest.write_text("partial", encoding="utf-8")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lexical, "write_jsonl", crash)
    with pytest.raises(SpecRagError, match="No space left on device"):
        index.save(path)
    after = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir()] == ["idx"]
    assert len(LexicalIndex.load(path)) == 2
    monkeypatch.undo()
    index.save(path)  # a later save replaces it
    assert len(LexicalIndex.load(path)) == len(DOCS)


def test_interrupted_swap_is_recovered(index, tmp_path):
    path = index.save(tmp_path / "idx")
    aside = tmp_path / ".idx.old-deadbeef"
    path.rename(aside)  # as if the process died between the two renames of a swap
    assert len(LexicalIndex.load(path)) == len(DOCS)
    assert path.is_dir() and not aside.exists()


def test_load_errors(tmp_path):
    with pytest.raises(SpecRagError, match="no index at"):
        LexicalIndex.load(tmp_path / "missing")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(SpecRagError, match="not a specrag index"):
        LexicalIndex.load(tmp_path / "notes")
    with pytest.raises(SpecRagError, match="refusing to overwrite"):
        LexicalIndex.build(DOCS).save(tmp_path / "notes")
    other = tmp_path / "other"
    other.mkdir()
    (other / "specrag_index.json").write_text(json.dumps({"kind": "dense", "format_version": 1}), encoding="utf-8")
    with pytest.raises(SpecRagError, match="'dense' index, not a 'bm25'"):
        LexicalIndex.load(other)
    with pytest.raises(SpecRagError, match="empty corpus"):
        LexicalIndex.build([])
