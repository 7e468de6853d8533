"""Token sampling on device: greedy, temperature, top-k, top-p, per-row parameters and seeds."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specrag_jax.errors import SpecRagError
from specrag_jax.models.sampling_filter import filtered_logits


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off; seed makes sampling reproducible."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise SpecRagError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise SpecRagError(f"top_k must be >= 0 (got {self.top_k})")
        if not (0.0 < self.top_p <= 1.0):
            raise SpecRagError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.seed < 0:
            raise SpecRagError(f"seed must be >= 0 (got {self.seed})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample_tokens(
    logits: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    seeds: jax.Array,
    steps: jax.Array,
    *,
    greedy_only: bool,
) -> tuple[jax.Array, jax.Array]:
    """Pick one token per row of float32 ``logits`` [R, V].

    Each row's key is ``fold_in(PRNGKey(seed), step)``, so a row samples the same tokens whatever batch it
    shares. Returns (token ids [R], the model's log-probability of each chosen token [R]).
    """
    logprobs_all = jax.nn.log_softmax(logits, axis=-1)
    greedy_ids = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if greedy_only:
        chosen = greedy_ids
    else:
        masked = filtered_logits(logits, temperature, top_k, top_p)
        keys = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.PRNGKey(s), t))(seeds, steps)
        sampled = jax.vmap(jax.random.categorical)(keys, masked).astype(jnp.int32)
        chosen = jnp.where(temperature > 0, sampled, greedy_ids)
    chosen_logprob = jnp.take_along_axis(logprobs_all, chosen[:, None], axis=-1)[:, 0]
    return chosen, chosen_logprob
