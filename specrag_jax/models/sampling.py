"""Token sampling on device: greedy, temperature, top-k, top-p, per-row parameters and seeds."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specrag_jax.errors import SpecRagError


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
        vocab = logits.shape[-1]
        scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
        sorted_desc = -jnp.sort(-scaled, axis=-1)
        k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
        kth = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)  # top-k threshold
        ranks = jnp.arange(vocab)[None, :]
        sorted_k = jnp.where(ranks < k[:, None], sorted_desc, -jnp.inf)
        probs = jax.nn.softmax(sorted_k, axis=-1)
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]  # smallest set reaching top_p
        n_keep = jnp.maximum(keep.sum(-1), 1)
        pth = jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)
        threshold = jnp.maximum(kth, pth)
        masked = jnp.where(scaled >= threshold, scaled, -jnp.inf)
        keys = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.PRNGKey(s), t))(seeds, steps)
        sampled = jax.vmap(jax.random.categorical)(keys, masked).astype(jnp.int32)
        chosen = jnp.where(temperature > 0, sampled, greedy_ids)
    chosen_logprob = jnp.take_along_axis(logprobs_all, chosen[:, None], axis=-1)[:, 0]
    return chosen, chosen_logprob
