"""Incremental detokenization equals decoding the whole output, on both real tokenizers and odd text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.models.tokenizer.detokenize import IncrementalDetokenizer
from specrag_jax.models.tokenizer.load import load_tokenizer

TEXTS = [
    "Paris is the capital of France.",
    "  two  spaces, \ttab\nnew line",
    "naïve café — déjà vu",
    "emoji 🙂🚀 and 中文字符 mixed",
    "1234567 + 89 = 1234656",
    "## Rationale: x\n## Response: y",
]
ALPHABET = st.sampled_from(list("ab cé中🙂\n\t 1.-#") + [" the", "ing", "  "])


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def tok(request):
    return load_tokenizer(request.param)


def _stream(tok, ids):
    detok = IncrementalDetokenizer(tok.decode)
    pieces = []
    for t in ids:
        pieces.append(detok.push(t))
        assert tok.decode(ids).startswith(detok.text)  # never emits text that a later token would change
    pieces.append(detok.flush())
    return "".join(pieces)


@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_full_decode(tok, text):
    ids = tok.encode(text, add_bos=False)
    assert _stream(tok, ids) == tok.decode(ids)


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(ALPHABET, min_size=1, max_size=30))
def test_stream_equals_full_decode_on_random_text(tok, parts):
    ids = tok.encode("".join(parts), add_bos=False)
    assert _stream(tok, ids) == tok.decode(ids)


def test_split_multibyte_character_is_held_back(tok):
    ids = tok.encode("🙂", add_bos=False)
    detok = IncrementalDetokenizer(tok.decode)
    out = [detok.push(t) for t in ids]
    assert "".join(out) + detok.flush() == tok.decode(ids)
    assert all("\ufffd" not in piece for piece in out)
