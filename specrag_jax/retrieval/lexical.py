"""BM25 over title + text (bm25s: an eager sparse score matrix, numpy only), persisted atomically.

Tokens: lower-cased words of two or more characters (bm25s' default pattern), English stop words removed
(``stopwords=None`` keeps them: IDF alone then discounts common words, and words such as "with", "if" or
"not" stay searchable, which matters for a corpus about Python), then Harman's "S" stemmer (plural endings only:
``-ies -> -y``, ``-es -> -e``, ``-s -> ''``) so a question about "dogs" finds a passage about a "dog" without a
stemming dependency. Lucene's BM25 variant, k1=1.5,
b=0.75. ``search`` returns only documents that share at least one term with the query.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import ModuleType
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.retrieval.corpus import Document, doc_text, read_jsonl, write_jsonl
from specrag_jax.retrieval.store import atomic_write_dir, resolve_index_dir

KIND = "bm25"
DOCS_NAME = "docs.jsonl"
BM25_DIR = "bm25"
STOPWORDS = ("en", None)


def _bm25s() -> ModuleType:
    """The bm25s module, with its logger quieted.

    Importing bm25s sets its logger to DEBUG, so the level must be set after the (lazy) import: before,
    it is overwritten, and once any root handler exists (``absl.logging`` installs one on orbax's import)
    ``DEBUG:bm25s:Building index from tokens`` reaches stderr."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def s_stem(word: str) -> str:
    """Harman (1991) S-stemmer: strip English plural endings only (conservative, no dictionary)."""
    if len(word) > 3 and word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if len(word) > 2 and word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


def _stem_all(words: list[str]) -> list[str]:
    return [s_stem(w) for w in words]


def tokenize(texts: Sequence[str], stopwords: str | None = "en") -> list[list[str]]:
    """Index/query tokens of each text (see the module docstring)."""
    bm25s = _bm25s()
    if stopwords not in STOPWORDS:
        raise SpecRagError(f"unknown stop-word list {stopwords!r}; choose one of {STOPWORDS}")
    return bm25s.tokenize(
        list(texts), stopwords=stopwords or [], stemmer=_stem_all, return_ids=False, show_progress=False
    )


def _top_n(scores: np.ndarray, n: int) -> list[tuple[int, float]]:
    """Indices of the ``n`` best positive scores, best first (ties: lower index first)."""
    positive = np.flatnonzero(scores > 0)
    if positive.size == 0 or n <= 0:
        return []
    order = positive[np.lexsort((positive, -scores[positive]))][:n]
    return [(int(i), float(scores[i])) for i in order]


class LexicalIndex:
    """BM25 index of a list of documents; ``search`` returns ``[(doc_index, score)]`` best first."""

    def __init__(self, docs: Sequence[Document], retriever, stopwords: str | None = "en") -> None:
        self.docs = list(docs)
        self._bm25 = retriever
        self.stopwords = stopwords

    @classmethod
    def build(
        cls, docs: Sequence[Document], *, k1: float = 1.5, b: float = 0.75, stopwords: str | None = "en"
    ) -> "LexicalIndex":
        bm25s = _bm25s()
        docs = list(docs)
        if not docs:
            raise SpecRagError("cannot build a BM25 index over an empty corpus")
        retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        retriever.index(tokenize([doc_text(d) for d in docs], stopwords), show_progress=False)
        return cls(docs, retriever, stopwords)

    def __len__(self) -> int:
        return len(self.docs)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` ([N] float32; 0 = no shared term)."""
        vocab = self._bm25.vocab_dict
        terms = [t for t in tokenize([query], self.stopwords)[0] if t and t in vocab]
        if not terms:
            return np.zeros(len(self.docs), np.float32)
        return np.asarray(self._bm25.get_scores(terms), np.float32)

    def search(self, query: str, n: int = 10) -> list[tuple[int, float]]:
        """Top-``n`` documents for ``query`` as ``(doc_index, score)``, best first (only score > 0)."""
        if n < 1:
            raise SpecRagError(f"number of documents to retrieve must be >= 1 (got {n})")
        return _top_n(self.scores(query), n)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write the index (and its documents) to the directory ``path`` atomically."""

        def write(tmp: Path) -> None:
            self._bm25.save(str(tmp / BM25_DIR), show_progress=False)
            write_jsonl(self.docs, tmp / DOCS_NAME)

        meta = {
            "num_docs": len(self.docs),
            "k1": self._bm25.k1,
            "b": self._bm25.b,
            "stopwords": self.stopwords,
            "stemmer": "harman-s",
        }
        return atomic_write_dir(path, KIND, meta, write)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LexicalIndex":
        bm25s = _bm25s()
        root, meta = resolve_index_dir(path, KIND)
        docs = read_jsonl(root / DOCS_NAME, keep_empty=True)
        try:
            retriever = bm25s.BM25.load(str(root / BM25_DIR), show_progress=False)
        except (OSError, ValueError, json.JSONDecodeError) as exc:
            raise SpecRagError(f"cannot load the BM25 index at {root}: {exc}") from exc
        if len(docs) != meta.get("num_docs"):
            raise SpecRagError(
                f"index {root} is inconsistent: {len(docs)} documents, metadata says {meta.get('num_docs')}; rebuild it"
            )
        return cls(docs, retriever, meta.get("stopwords"))
