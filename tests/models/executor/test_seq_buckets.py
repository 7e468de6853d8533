"""Decode-width buckets: exact up to 8 sequences, then under a third of padding; a caller's width is kept by
packing; five sequences decoded on five rows give the tokens they give on eight (and alone)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.packing import (
    EXACT_SEQ_COUNTS,
    bucket,
    pack_chunks,
    seq_count_bucket,
    seq_count_buckets,
)
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.generation import greedy_generate


@given(st.integers(1, 5000))
@settings(max_examples=300, deadline=None)
def test_seq_count_bucket_covers_and_wastes_under_a_third(n):
    b = seq_count_bucket(n)
    assert b >= n and b in seq_count_buckets(n)
    if n <= EXACT_SEQ_COUNTS:
        assert b == n
    else:
        assert (b - n) / b < 1 / 3 and b <= bucket(n)
    assert seq_count_bucket(n + 1) >= b  # monotone


def test_seq_count_buckets_ladder():
    assert seq_count_buckets(5) == [1, 2, 3, 4, 5]
    assert seq_count_buckets(30) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32]


def _decode_chunks(n: int) -> list[Chunk]:
    return [Chunk(pages=[1 + i], kv_len=3, tokens=[7 + i], rows=[0]) for i in range(n)]


def test_packing_keeps_a_covering_min_seqs_and_rounds_otherwise():
    for n, min_seqs, want in [(5, 5, 5), (5, 6, 6), (5, 1, 8), (5, 4, 8), (3, 8, 8), (9, 1, 16)]:
        step = pack_chunks(_decode_chunks(n), page_size=16, num_slots=16 * 32, min_seqs=min_seqs)
        assert step.meta.page_table.shape[0] == want and step.rows.shape[0] == want, (n, min_seqs)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_five_rows_and_eight_rows_give_the_same_decode_logits_and_tokens(family):
    cfg = tiny_config(family, tie_embeddings=family == "gemma3")
    r = ModelRunner(cfg, init_params(cfg, seed=5), num_pages=64, page_size=16, max_seq_len=256)
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, 60, int(n))] for n in rng.integers(4, 40, 5)]
    out = greedy_generate(r, prompts, 10)  # decodes on seq_count_bucket(5) = 5 rows
    assert out == [greedy_generate(r, [p], 10)[0] for p in prompts]
    pages = [r.allocator.allocate(3) for _ in prompts]
    try:
        prefill = [Chunk(pg, 0, p + o[:1], rows=[]) for pg, p, o in zip(pages, prompts, out)]
        r.logits(r.pack(prefill))  # writes every prompt's K/V
        step = [Chunk(pg, len(p) + 1, [o[1]], rows=[0]) for pg, p, o in zip(pages, prompts, out)]
        five, eight = (r.logits(r.pack(step, token_bucket=w, min_seqs=w)) for w in (5, 8))
    finally:
        for pg in pages:
            r.allocator.release(pg)
    assert five.shape == eight.shape == (5, cfg.vocab_size)
    np.testing.assert_allclose(five, eight, atol=1e-5, rtol=1e-5)
    assert [int(t) for t in five.argmax(-1)] == [o[2] for o in out]
