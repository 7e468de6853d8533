"""Engine request and sequence records, and the engine's errors."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.sampling import SamplingParams

StopFn = Callable[[int, list[int]], bool]
TokenFn = Callable[[int, int], None]  # (branch, token id), called on the engine thread as tokens arrive


class EngineError(SpecRagError):
    """A request the engine could not serve."""


class QueueFull(EngineError):
    """The engine's waiting queue is full (HTTP 429)."""


class RequestCancelled(EngineError):
    """The request was cancelled (client gone, shutdown)."""


class RequestTimeout(EngineError):
    """The request ran past its deadline."""


class EngineStopped(EngineError):
    """The engine no longer accepts work."""


@dataclasses.dataclass
class Tree:
    """A token tree scored against a cached prefix: chunk-local parents/positions, wanted rows and targets."""

    tokens: list[int]
    parents: list[int]
    positions: list[int]
    rows: list[int]
    targets: list[int]


@dataclasses.dataclass(eq=False)
class Seq:
    """One sequence in the pool: a prompt (prefilled in chunks) and, when it samples, its generated tokens.

    ``sampling`` None marks a prefix-only sequence (a shared prefix or a tree's prefix): prefilled, never
    sampled. ``ready`` is False while the sequence waits for its group's shared prefix.
    """

    req: "Request"
    branch: int
    prompt: list[int]
    pages: list[int]
    prefilled: int = 0
    sampling: SamplingParams | None = None
    ready: bool = True
    out: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish: str | None = None
    prefill_done_at: float = 0.0
    finished_at: float = 0.0

    @property
    def prefilling(self) -> bool:
        return self.ready and self.prefilled < len(self.prompt)

    @property
    def decoding(self) -> bool:
        return self.ready and self.sampling is not None and self.finish is None and bool(self.out)


@dataclasses.dataclass(eq=False)
class Request:
    """One unit of engine work: a group of branches to generate, or a tree to score. ``future`` resolves to
    a list of ``GenerationResult`` (generate) or a float32 array of log-probabilities (score)."""

    kind: str  # "generate" | "score"
    prefix: list[int]
    suffixes: Sequence[Sequence[int]] = ()
    sampling: Sequence[SamplingParams] = ()
    max_new_tokens: int = 0
    stop_fn: StopFn | None = None
    on_token: TokenFn | None = None
    tree: Tree | None = None
    deadline: float | None = None
    future: Future = dataclasses.field(default_factory=Future)
    cancelled: bool = False
    seqs: list[Seq] = dataclasses.field(default_factory=list)
    prefix_seq: Seq | None = None
    shared_len: int = 0
    cached_tokens: int = 0  # prompt tokens served by the prefix cache
    submitted_at: float = dataclasses.field(default_factory=time.perf_counter)
    admitted_at: float = 0.0
    _engine: object = None

    def cancel(self) -> None:
        """Ask the engine to drop this request (its pages return to the pool on the next step)."""
        self.cancelled = True
        if self._engine is not None:
            self._engine.wake()  # type: ignore[attr-defined]

    def result(self, timeout: float | None = None):
        return self.future.result(timeout)

    def all_seqs(self) -> list[Seq]:
        return ([self.prefix_seq] if self.prefix_seq is not None else []) + self.seqs
