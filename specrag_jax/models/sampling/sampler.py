"""The jitted sampler: penalties, then greedy or temperature / top-k / top-p sampling, and log-probabilities.

Reported log-probabilities (the chosen token's and the top ``MAX_TOP_LOGPROBS`` alternatives) are the
log-softmax of the *penalised* logits, before temperature, top-k and top-p. With no penalty that is vLLM V1's
default ``raw_logprobs``; vLLM's V0 sampler (and its ``processed_logprobs`` mode) also divides by the
temperature, which would report different numbers for the same tokens under greedy and sampled requests.
The alternatives are computed on device only when a row asks for them (``lax.cond``; one program either way).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.filtering import filtered_logits
from specrag_jax.models.sampling.params import MAX_TOP_LOGPROBS
from specrag_jax.models.sampling.penalties import PenaltyState, penalized_logits


class SampleOut(NamedTuple):
    ids: jax.Array  # [R] chosen tokens
    logprobs: jax.Array  # [R] their log-probabilities
    top_ids: jax.Array  # [R, MAX_TOP_LOGPROBS] the most likely tokens (zeros when no row asked)
    top_logprobs: jax.Array  # [R, MAX_TOP_LOGPROBS] their log-probabilities, descending


def top_logprobs(
    x: jax.Array, top_n: jax.Array, prepare: Callable[[jax.Array], jax.Array] = lambda x: x
) -> tuple[jax.Array, jax.Array]:
    """(ids, log-probabilities) of the ``MAX_TOP_LOGPROBS`` most likely tokens of each row of the log-probabilities
    ``prepare(x) [..., V]`` when any ``top_n`` > 0, else zeros (then neither ``prepare`` nor top-k runs)."""
    shape = jax.eval_shape(prepare, x).shape[:-1] + (MAX_TOP_LOGPROBS,)

    def top(x):
        vals, ids = jax.lax.top_k(prepare(x), MAX_TOP_LOGPROBS)
        return ids.astype(jnp.int32), vals.astype(jnp.float32)

    def none(x):
        return jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32)

    return jax.lax.cond(jnp.any(top_n > 0), top, none, x)


def sample_tokens(logits: jax.Array, batch: SamplingBatch, penalties: PenaltyState, *, greedy_only: bool) -> SampleOut:
    """Pick one token per row of float32 ``logits`` [R, V] with the rows' parameters (``batch``).

    Each row's key is ``fold_in(PRNGKey(seed), step)``, so a row samples the same tokens whatever batch it
    shares."""
    logits = penalized_logits(logits, batch, penalties)
    logprobs_all = jax.nn.log_softmax(logits, axis=-1)
    greedy_ids = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if greedy_only:
        chosen = greedy_ids
    else:
        masked = filtered_logits(logits, batch.temperature, batch.top_k, batch.top_p)
        keys = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.PRNGKey(s), t))(batch.seeds, batch.steps)
        sampled = jax.vmap(jax.random.categorical)(keys, masked).astype(jnp.int32)
        chosen = jnp.where(batch.temperature > 0, sampled, greedy_ids)
    chosen_logprob = jnp.take_along_axis(logprobs_all, chosen[:, None], axis=-1)[:, 0]
    return SampleOut(chosen, chosen_logprob, *top_logprobs(logprobs_all, batch.top_n))
