"""Log-probabilities of chosen tokens without a full [tokens, vocab] logits array.

The output projection is applied chunk by chunk over the vocabulary with an online log-sum-exp, so the
largest live array is [rows, vocab_chunk] (Gemma 3's vocabulary has 262,144 entries). The chunks are a free
reshape of the output table whenever the vocabulary has a divisor near the wanted chunk (``vocab_chunk_size``):
padding it instead copied the whole table on every call (Qwen2.5's 151,936 x 1,536 float32 table, 0.93 GB,
into fresh memory each verification pass: measured 1.5x slower verification on this CPU, see ``README``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.transformer import logits_at

DEFAULT_VOCAB_CHUNK = 16384
PAD_FREE_CHUNKS = True  # False: always ``DEFAULT_VOCAB_CHUNK`` rows, the padded table (benchmarks/verification_pass.py)


def vocab_chunk_size(vocab: int, target: int = DEFAULT_VOCAB_CHUNK) -> int:
    """The chunk ``token_logprobs`` splits a ``vocab``-row table into: the divisor of ``vocab`` nearest
    ``target`` within [target / 2, 2 * target] (the table reshapes into chunks without a copy), else ``target``
    (the table is padded with zero rows: a copy)."""
    if vocab <= target or not PAD_FREE_CHUNKS:
        return target
    fits = [c for c in range(max(target // 2, 1), 2 * target + 1) if vocab % c == 0]
    return min(fits, key=lambda c: (abs(c - target), c)) if fits else target


def _vocab_chunks(params: dict, cfg: ModelConfig, chunk: int) -> jax.Array:
    """Output weights as [n_chunks, chunk, hidden] (vocab padded with zero rows when ``chunk`` does not divide
    it)."""
    w = params["embed"]["embedding"] if cfg.tie_embeddings else params["lm_head"]["kernel"]  # both [V, H]
    vocab = w.shape[0]
    pad = (-vocab) % chunk
    if pad:
        w = jnp.pad(w, ((0, pad), (0, 0)))
    return w.reshape(-1, chunk, w.shape[1])


def token_logprobs(
    params: dict, cfg: ModelConfig, hidden: jax.Array, targets: jax.Array, vocab_chunk: int = DEFAULT_VOCAB_CHUNK
) -> jax.Array:
    """log p(targets[r] | hidden[r]) for [R, hidden] rows, float32 [R] (the vocabulary in chunks of about
    ``vocab_chunk`` rows, ``vocab_chunk_size``)."""
    vocab = cfg.vocab_size
    if vocab <= vocab_chunk:
        return jnp.take_along_axis(jax.nn.log_softmax(logits_at(params, cfg, hidden), -1), targets[:, None], -1)[:, 0]
    vocab_chunk = vocab_chunk_size(vocab, vocab_chunk)
    w_chunks = _vocab_chunks(params, cfg, vocab_chunk)
    beyond = w_chunks.shape[0] * vocab_chunk > vocab  # padding rows, or a table longer than the vocabulary
    h = hidden.astype(w_chunks.dtype)
    cap = cfg.final_logit_softcap
    rows = hidden.shape[0]

    def body(carry, inputs):
        run_max, run_sum, target_logit = carry
        w, start = inputs
        logits = jnp.einsum("rh,ch->rc", h, w, preferred_element_type=jnp.float32)
        if cap is not None:
            logits = cap * jnp.tanh(logits / cap)
        if beyond:  # rows past the vocabulary are not tokens
            logits = jnp.where((start + jnp.arange(vocab_chunk))[None, :] < vocab, logits, -jnp.inf)
        new_max = jnp.maximum(run_max, logits.max(-1))
        run_sum = run_sum * jnp.exp(run_max - new_max) + jnp.exp(logits - new_max[:, None]).sum(-1)
        in_chunk = (targets >= start) & (targets < start + vocab_chunk)
        picked = jnp.take_along_axis(logits, jnp.clip(targets - start, 0, vocab_chunk - 1)[:, None], -1)[:, 0]
        target_logit = jnp.where(in_chunk, picked, target_logit)
        return (new_max, run_sum, target_logit), None

    starts = jnp.arange(w_chunks.shape[0], dtype=jnp.int32) * vocab_chunk
    init = (jnp.full(rows, -jnp.inf, jnp.float32), jnp.zeros(rows, jnp.float32), jnp.zeros(rows, jnp.float32))
    (run_max, run_sum, target_logit), _ = jax.lax.scan(body, init, (w_chunks, starts))
    return target_logit - (run_max + jnp.log(run_sum))
