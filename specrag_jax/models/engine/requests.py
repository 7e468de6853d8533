"""Engine request and sequence records, and the engine's errors."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.rules import StopFn
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation, SpeculationStats

TokenFn = Callable[[int, int], None]  # (branch, token id), called on the engine thread as tokens arrive
TopLogprobs = tuple[list[int], list[float]]  # a token's likeliest alternatives: ids, log-probabilities


def top_of(ids, logprobs, n: int) -> TopLogprobs | None:
    """The first ``n`` of a step's top log-probability row (None when the sequence asked for none)."""
    return ([int(i) for i in ids[:n]], [float(v) for v in logprobs[:n]]) if n else None


class EngineError(SpecRagError):
    """A request the engine could not serve."""


class QueueFull(EngineError):
    """The engine's waiting queue is full (HTTP 429)."""


class RequestCancelled(EngineError):
    """The request was cancelled (client gone, shutdown)."""


class RequestTimeout(EngineError):
    """The request ran past its deadline."""


class PhaseError(EngineError):
    """A phase transition that needs more tokens than the request reserved."""


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
    top_logprobs: list[TopLogprobs] = dataclasses.field(default_factory=list)  # per token, when asked for
    penalty_slot: int = 0  # its row of device token counts (``models.sampling.penalties``); 0 = no penalties
    finish: str | None = None
    prefill_done_at: float = 0.0
    finished_at: float = 0.0
    phase_started_at: float = 0.0
    # the engine thread's compile seconds (``compile_time.thread_compile_s``) at those three moments
    prefill_done_compile_s: float = 0.0
    finished_compile_s: float = 0.0
    phase_started_compile_s: float = 0.0
    phase: int = 0  # index into the request's phases (generate_phases requests)
    phase_results: list = dataclasses.field(default_factory=list)  # GenerationResult of each finished phase
    spec_stats: SpeculationStats | None = None  # decode counts of the current phase (speculating requests)

    @property
    def prefilling(self) -> bool:
        return self.ready and self.prefilled < len(self.prompt)

    @property
    def decoding(self) -> bool:
        return self.ready and self.sampling is not None and self.finish is None and bool(self.out)


@dataclasses.dataclass(eq=False)
class Request:
    """One unit of engine work: a group of branches to generate, or a tree to score. ``future`` resolves to
    a list of ``GenerationResult`` (generate), one such list per phase (generate with ``phases``) or a float32
    array of log-probabilities (score)."""

    kind: str  # "generate" | "score"
    prefix: list[int]
    suffixes: Sequence[Sequence[int]] = ()
    sampling: Sequence[SamplingParams] = ()
    max_new_tokens: int = 0
    stop_fn: StopFn | None = None
    on_token: TokenFn | None = None
    tree: Tree | None = None
    phases: Sequence = ()  # rules.Phase list: the sequences keep their K/V from one to the next
    between: Callable | None = None  # (phase, branch, GenerationResult) -> (kept tokens, forced tokens)
    max_forced_tokens: int = 0  # forced tokens ``between`` may add over all phases (reserved up front)
    speculation: Speculation | None = None  # decode with token trees (``spec_steps.py``)
    deadline: float | None = None
    future: Future = dataclasses.field(default_factory=Future)
    cancelled: bool = False
    seqs: list[Seq] = dataclasses.field(default_factory=list)
    prefix_seq: Seq | None = None
    # score: the prefix tokens scored inside the tree's own step instead of prefilled into pages first (an engine
    # without a prefix cache keeps no prefix K/V, so a separate prefill step would only cost a pass over the weights)
    inline_prefix: bool = False
    shared_len: int = 0
    cached_tokens: int = 0  # prompt tokens served by the prefix cache
    submitted_at: float = dataclasses.field(default_factory=time.perf_counter)
    admitted_at: float = 0.0
    admitted_compile_s: float = 0.0  # the engine thread's compile seconds when it was admitted
    compile_s: float = 0.0  # a score request's: the engine thread's compile seconds from admission to its scores
    on_cancel: Callable[[], None] | None = None  # set by the engine that queued it: wakes its loop

    def cancel(self) -> None:
        """Ask the engine to drop this request (its pages return to the pool on the next step)."""
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel()

    def phase_limit(self, seq: Seq) -> tuple[int, StopFn | None]:
        """The token budget and stop condition of the phase ``seq`` is in."""
        if self.phases:
            ph = self.phases[seq.phase]
            return ph.max_new_tokens, ph.stop_fn
        return self.max_new_tokens, self.stop_fn

    def result(self, timeout: float | None = None):
        return self.future.result(timeout)

    def all_seqs(self) -> list[Seq]:
        return ([self.prefix_seq] if self.prefix_seq is not None else []) + self.seqs
