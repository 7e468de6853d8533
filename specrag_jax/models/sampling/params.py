"""Per-request sampling settings (``SamplingParams``); the device side is ``sampler.py``."""

from __future__ import annotations

import dataclasses

from specrag_jax.errors import SpecRagError

MAX_TOP_LOGPROBS = 20  # alternatives a row may ask for: the step always computes this many (static shape)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off; seed makes sampling reproducible.

    Penalties (0, 0, 1 = off): ``presence_penalty`` and ``frequency_penalty`` subtract ``p * (count > 0)`` and
    ``f * count`` over the tokens generated so far (OpenAI); ``repetition_penalty`` divides a positive logit
    (multiplies a negative one) of every token seen in the prompt or the output (vLLM / HF).
    ``top_logprobs``: the most likely alternatives reported with each token (0 .. ``MAX_TOP_LOGPROBS``)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise SpecRagError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise SpecRagError(f"top_k must be >= 0 (got {self.top_k})")
        if not (0.0 < self.top_p <= 1.0):
            raise SpecRagError(f"top_p must be in (0, 1] (got {self.top_p})")
        if not 0 <= self.seed < 2**32:
            raise SpecRagError(f"seed must be in [0, 2**32) (got {self.seed})")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise SpecRagError(f"{name} must be in [-2, 2] (got {getattr(self, name)})")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise SpecRagError(f"repetition_penalty must be in (0, 10] (got {self.repetition_penalty})")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise SpecRagError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}] (got {self.top_logprobs})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on (the sequence then needs a row of device token counts)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
