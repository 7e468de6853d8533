"""Sampling: per-request settings, one step's batch of them, penalties, and the jitted sampler.

``params`` (``SamplingParams``, validated on the host), ``batch`` (``SamplingBatch``: every sampled row's
parameters as one pytree), ``penalties`` (presence / frequency / repetition over device token counts),
``filtering`` (temperature, top-k, top-p: the distribution both plain and speculative sampling draw from),
``sampler`` (penalties, then greedy or filtered sampling, and log-probabilities).
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "params": ("MAX_TOP_LOGPROBS", "SamplingParams"),
    "batch": ("SamplingBatch",),
    "penalties": ("PenaltyState", "PenaltyTable"),
    "filtering": ("filtered_logits", "target_probs"),
    "sampler": ("SampleOut", "sample_tokens", "top_logprobs"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
