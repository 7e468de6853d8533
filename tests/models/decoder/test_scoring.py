"""token_logprobs: the chunked online log-sum-exp against a float64 log-softmax, and chunks that split the
output table without a padded copy wherever the vocabulary allows it."""

from __future__ import annotations

import dataclasses

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.scoring import token_logprobs, vocab_chunk_size


def _reference(hidden: np.ndarray, table: np.ndarray, targets: np.ndarray, cap: float | None) -> np.ndarray:
    logits = hidden.astype(np.float64) @ table.astype(np.float64).T
    if cap is not None:
        logits = cap * np.tanh(logits / cap)
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return logp[np.arange(len(targets)), targets]


@settings(max_examples=25, deadline=None)
@given(
    vocab=st.integers(2, 300),
    chunk=st.integers(2, 64),
    rows=st.integers(1, 9),
    tied=st.booleans(),
    cap=st.sampled_from([None, 5.0]),
    seed=st.integers(0, 2**16),
)
def test_chunked_logprobs_match_the_full_log_softmax(vocab, chunk, rows, tied, cap, seed):
    cfg = dataclasses.replace(tiny_config("llama"), vocab_size=vocab, tie_embeddings=tied, final_logit_softcap=cap)
    rng = np.random.default_rng(seed)
    table = rng.normal(0, 2, (vocab, cfg.hidden_size)).astype(np.float32)
    hidden = rng.normal(0, 1, (rows, cfg.hidden_size)).astype(np.float32)
    targets = rng.integers(0, vocab, rows)
    params = {"embed": {"embedding": table}} if tied else {"lm_head": {"kernel": table}}
    got = jax.jit(token_logprobs, static_argnums=(1, 4))(params, cfg, hidden, targets, chunk)
    np.testing.assert_allclose(np.asarray(got), _reference(hidden, table, targets, cap), rtol=1e-5, atol=1e-4)


@given(vocab=st.integers(1, 200_000), target=st.integers(1, 20_000))
def test_vocab_chunk_size_divides_when_a_divisor_is_near(vocab, target):
    chunk = vocab_chunk_size(vocab, target)
    near = [c for c in range(max(target // 2, 1), 2 * target + 1) if vocab % c == 0]
    if vocab > target and near:
        assert vocab % chunk == 0 and abs(chunk - target) == min(abs(c - target) for c in near)
    else:
        assert chunk == target


def _primitives(jaxpr) -> set[str]:
    """Every primitive in a jaxpr, nested ones (jit, scan bodies) included."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


def test_real_vocabularies_are_scored_without_a_padded_table_copy():
    """Qwen2.5 (151,936 = 128 x 1,187), Llama 3 (128,256), Mistral (32,000) and Gemma 3 (262,144): no pad."""
    for vocab in (151_936, 128_256, 32_000, 262_144, 49_152):
        cfg = dataclasses.replace(tiny_config("llama"), vocab_size=vocab, hidden_size=64, tie_embeddings=True)
        params = {"embed": {"embedding": jax.ShapeDtypeStruct((vocab, 64), jnp.float32)}}
        hidden = jax.ShapeDtypeStruct((8, 64), jnp.float32)
        targets = jax.ShapeDtypeStruct((8,), jnp.int32)
        jaxpr = jax.make_jaxpr(lambda p, h, t, cfg=cfg: token_logprobs(p, cfg, h, t))(params, hidden, targets)
        assert "pad" not in _primitives(jaxpr.jaxpr), vocab
    # the negative control: a prime-ish vocabulary with no divisor near the chunk is padded
    cfg = dataclasses.replace(cfg, vocab_size=50_257)
    params = {"embed": {"embedding": jax.ShapeDtypeStruct((50_257, 64), jnp.float32)}}
    jaxpr = jax.make_jaxpr(lambda p, h, t: token_logprobs(p, cfg, h, t))(params, hidden, targets)
    assert "pad" in _primitives(jaxpr.jaxpr)


def test_rows_past_the_vocabulary_are_not_tokens():
    """A table longer than ``vocab_size`` (144 rows, 96 tokens: the chunk 48 divides both) scores over the
    vocabulary only, as when the table has to be padded."""
    cfg = dataclasses.replace(tiny_config("llama"), vocab_size=96, tie_embeddings=True)
    rng = np.random.default_rng(0)
    table = rng.normal(0, 2, (144, cfg.hidden_size)).astype(np.float32)
    hidden = rng.normal(0, 1, (5, cfg.hidden_size)).astype(np.float32)
    targets = rng.integers(0, 96, 5)
    assert vocab_chunk_size(96, 64) == 48
    got = token_logprobs({"embed": {"embedding": table}}, cfg, hidden, targets, 64)
    np.testing.assert_allclose(np.asarray(got), _reference(hidden, table[:96], targets, None), rtol=1e-5, atol=1e-4)
