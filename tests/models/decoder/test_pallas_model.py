"""The decoder with attention_impl="pallas" (interpret mode on CPU) against the reference path."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.generation import greedy_generate

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [3, 4, 5]]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tiny_model_pallas_matches_reference(arch):
    cfg = tiny_config(arch, head_dim=64 if arch == "llama" else 32)
    params = init_params(cfg, seed=2)
    runners = {
        impl: ModelRunner(cfg, params, num_pages=48, page_size=16, max_seq_len=128, attention_impl=impl)
        for impl in ("reference", "pallas")
    }
    ids = {impl: greedy_generate(r, PROMPTS, 6) for impl, r in runners.items()}
    assert ids["pallas"] == ids["reference"]
    # A verification-style tree: prefix cached in pages, three branches in one chunk.
    logits = {}
    for impl, r in runners.items():
        pages = r.allocator.allocate(2)
        r.score(r.pack([Chunk(pages, 0, list(range(3, 23)), rows=[0])]), [1])  # cache 20 prefix tokens
        tree = Chunk(
            pages,
            20,
            [30, 31, 32, 40, 41, 50],
            parents=[-1, 0, 1, -1, 3, -1],
            positions=[20, 21, 22, 20, 21, 20],
            write=False,
            rows=list(range(6)),
        )
        logits[impl] = r.logits(r.pack([tree]))
        r.allocator.release(pages)
    np.testing.assert_allclose(logits["pallas"], logits["reference"], atol=1e-4)


@pytest.mark.slow
def test_gemma_greedy_tokens_match_with_pallas():
    from specrag_jax.models.text_model import TextModel

    ref = TextModel.load("gemma3-270m", max_seq_len=256, max_batch=1)
    pallas = ModelRunner(
        ref.runner.cfg, ref.runner.params, num_pages=18, page_size=16, max_seq_len=256, attention_impl="pallas"
    )
    prompt = ref.tokenizer.encode("The tallest mountain on Earth is", add_bos=True)
    assert greedy_generate(pallas, [prompt], 4) == greedy_generate(ref.runner, [prompt], 4)
