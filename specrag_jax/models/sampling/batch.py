"""One step's sampling metadata: every sampled row's parameters, as ONE pytree carried into the jitted sampler.

Built on the host from the rows' ``SamplingParams`` (numpy, padded to the step's row bucket with neutral
rows: greedy, no penalty, no alternatives), so the step's shapes depend on the bucket only and a request's
values never cause a compilation. ``slots`` names each row's row of device token counts (``penalties.py``);
0 is the zero row of a sequence without penalties.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from specrag_jax.models.sampling.params import SamplingParams

_FIELDS = {  # name: (dtype, value of a padded row)
    "temperature": (np.float32, 0.0),
    "top_k": (np.int32, 0),
    "top_p": (np.float32, 1.0),
    "seeds": (np.uint32, 0),
    "steps": (np.int32, 0),
    "presence": (np.float32, 0.0),
    "frequency": (np.float32, 0.0),
    "repetition": (np.float32, 1.0),
    "slots": (np.int32, 0),
    "top_n": (np.int32, 0),
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingBatch:
    """Per-row arrays ``[R]``: temperature (0 = greedy), top_k (0 = off), top_p (1 = off), PRNG seed and step
    (the row's key is ``fold_in(PRNGKey(seed), step)``), presence / frequency / repetition penalties, the row's
    token-count slot, and how many top log-probabilities it wants."""

    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    seeds: np.ndarray
    steps: np.ndarray
    presence: np.ndarray
    frequency: np.ndarray
    repetition: np.ndarray
    slots: np.ndarray
    top_n: np.ndarray

    @classmethod
    def of(
        cls, params: Sequence[SamplingParams], steps: Sequence[int], slots: Sequence[int] | None = None
    ) -> "SamplingBatch":
        """The rows of ``params`` (``steps``: tokens each row has generated; ``slots``: count rows, default 0)."""
        cols = {
            "temperature": [p.temperature for p in params],
            "top_k": [p.top_k for p in params],
            "top_p": [p.top_p for p in params],
            "seeds": [p.seed for p in params],
            "steps": list(steps),
            "presence": [p.presence_penalty for p in params],
            "frequency": [p.frequency_penalty for p in params],
            "repetition": [p.repetition_penalty for p in params],
            "slots": list(slots) if slots is not None else [0] * len(params),
            "top_n": [p.top_logprobs for p in params],
        }
        return cls(**{k: np.asarray(v, _FIELDS[k][0]).reshape(len(params)) for k, v in cols.items()})

    @classmethod
    def greedy(cls, rows: int) -> "SamplingBatch":
        """``rows`` greedy rows without penalties (warm-up, tests, benchmarks)."""
        return cls.of([SamplingParams()] * rows, [0] * rows)

    @property
    def num_rows(self) -> int:
        return int(self.temperature.shape[0])

    def padded(self, rows: int) -> "SamplingBatch":
        """The batch grown to ``rows`` rows with neutral ones (a padded row samples greedily and counts nothing)."""
        extra = rows - self.num_rows
        if extra < 0:
            raise ValueError(f"{self.num_rows} sampling rows for a step of {rows}")
        return SamplingBatch(
            **{k: np.concatenate([getattr(self, k), np.full(extra, v, dt)]) for k, (dt, v) in _FIELDS.items()}
        )

    def greedy_only(self, real_rows: int | None = None) -> bool:
        """Whether the first ``real_rows`` rows (default all) are greedy: the step then skips the filters."""
        return bool(np.all(self.temperature[:real_rows] == 0))

    @property
    def penalized(self) -> bool:
        return bool(np.any(self.slots > 0))
