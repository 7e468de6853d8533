"""Padding and attention blocking never change tokens: the fine token ladder vs power-of-two buckets, one long
step (query-blocked attention) vs chunked prefill (the reference), on tiny random models of two families."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.packing import bucket, token_count_bucket
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.generation import Generator

LONG = 700  # > kernels.blocked.DEFAULT_BLOCK: one step of it takes the blocked path


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def runner(request):
    cfg = tiny_config(request.param, tie_embeddings=request.param == "gemma3")
    return ModelRunner(cfg, init_params(cfg, seed=3), num_pages=128, page_size=16, max_seq_len=1024)


def _prompt(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 60, n)]


@pytest.mark.parametrize("n", [300, LONG])
def test_fine_and_power_of_two_buckets_give_the_same_logits(runner, n):
    tokens = _prompt(n)
    chunk = Chunk(pages=[], kv_len=0, tokens=tokens, write=False, rows=list(range(0, n, 37)))
    assert token_count_bucket(n) < bucket(n)
    fine = runner.logits(runner.pack([chunk]))
    coarse = runner.logits(runner.pack([chunk], token_bucket=bucket(n)))
    np.testing.assert_allclose(fine, coarse, atol=2e-5, rtol=1e-5)
    assert np.array_equal(fine.argmax(-1), coarse.argmax(-1))


def test_tree_step_with_blocked_attention_equals_per_branch_scoring(runner):
    """A shared prefix and three long branches in one step (> one block) against each branch alone."""
    prefix, branches = _prompt(40, 1), [_prompt(220, s) for s in (2, 3, 4)]
    tokens, parents = list(prefix), list(range(-1, len(prefix) - 1))
    ends = []
    for b in branches:
        start = len(tokens)
        tokens += b
        parents += [len(prefix) - 1] + list(range(start, start + len(b) - 1))
        ends.append(len(tokens) - 1)
    positions = list(range(len(prefix))) + [len(prefix) + i for b in branches for i in range(len(b))]
    packed = runner.logits(
        runner.pack([Chunk([], 0, tokens, parents=parents, positions=positions, write=False, rows=ends)])
    )
    assert len(tokens) > 512
    for i, b in enumerate(branches):
        alone = runner.logits(runner.pack([Chunk([], 0, prefix + b, write=False, rows=[len(prefix) + len(b) - 1])]))
        np.testing.assert_allclose(packed[i], alone[0], atol=2e-5, rtol=1e-5)


def test_greedy_tokens_of_a_long_prompt_do_not_depend_on_prefill_chunking(runner):
    prompt = _prompt(LONG, 5)
    whole = Generator(runner, max_prefill_tokens=1024).generate([prompt], max_new_tokens=8)[0]
    chunked = Generator(runner, max_prefill_tokens=256).generate([prompt], max_new_tokens=8)[0]
    assert whole.token_ids == chunked.token_ids
    np.testing.assert_allclose(whole.logprobs, chunked.logprobs, atol=1e-4)
