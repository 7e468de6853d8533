"""The rules every generation follows, whoever drives the engine: phases, results, when a sequence ends, how a
branch moves to its next phase, and which prompts the context can hold."""

from __future__ import annotations

import dataclasses
from typing import Callable, Collection, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.speculative.decode import SpeculationStats

StopFn = Callable[[int, list[int]], bool]  # (branch, its tokens so far) -> stop now
BetweenFn = Callable[[int, int, "GenerationResult"], tuple[int, Sequence[int]]]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of a phased generation (``Generator.generate_phases``): its token budget and stop condition."""

    max_new_tokens: int
    stop_fn: StopFn | None = None


@dataclasses.dataclass
class GenerationResult:
    """Generated ids (EOS included when it ended the sequence) and their log-probabilities."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" | "length"
    num_prompt_tokens: int
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # of those, one-time XLA work on the engine's thread (a program compiled or loaded for a step it ran)
    prefill_compile_s: float = 0.0
    decode_compile_s: float = 0.0
    shared_prefix_tokens: int = 0  # prompt tokens whose K/V came from pages shared with other branches
    speculation: SpeculationStats | None = None  # decode-phase counts when the request speculated
    top_logprobs: list | None = None  # per token (ids, log-probabilities) of the likeliest, when asked


def finish_reason(
    token: int, out: list[int], row: int, eos_ids: Collection[int], stop_fn: StopFn | None, max_new: int
) -> str | None:
    """Why a sequence whose newest token is ``token`` (already appended to ``out``) ends: "eos", "stop" (``stop_fn``
    of its ``row``), "length" (``max_new`` tokens), or None."""
    if token in eos_ids:
        return "eos"
    if stop_fn is not None and stop_fn(row, out):
        return "stop"
    if len(out) >= max_new:
        return "length"
    return None


def next_phase_prompt(
    prompt: list[int], out: list[int], between: BetweenFn | None, phase: int, row: int, result: GenerationResult
) -> tuple[list[int], int]:
    """A branch's prompt for its next phase (prompt + kept tokens + forced tokens) and how much of it already
    has K/V in the pool: the old prompt and the kept tokens that were fed back (the last sampled one never is)."""
    keep, forced = between(phase, row, result) if between else (len(out), [])
    keep = max(0, min(int(keep), len(out)))
    valid = len(prompt) + min(keep, max(len(out) - 1, 0))
    new_prompt = prompt + out[:keep] + [int(t) for t in forced]
    return new_prompt, min(valid, len(new_prompt) - 1)


def check_prompt(runner: ModelRunner, prompt: Sequence[int], max_new_tokens: int) -> None:
    """Raise SpecRagError when a prompt is empty, holds an id outside the vocabulary, or does not fit the
    context with ``max_new_tokens`` more."""
    if len(prompt) == 0:
        raise SpecRagError("empty prompt: nothing to generate from")
    limit = runner.max_seq_len
    if len(prompt) + max_new_tokens > limit:
        raise SpecRagError(
            f"prompt is too long: {len(prompt)} tokens + max_new_tokens {max_new_tokens} exceeds the "
            f"context of {limit} tokens"
        )
    bad = [t for t in prompt if not 0 <= int(t) < runner.cfg.vocab_size]
    if bad:
        raise SpecRagError(f"token id {bad[0]} is outside the vocabulary (size {runner.cfg.vocab_size})")


__all__ = ["BetweenFn", "GenerationResult", "Phase", "StopFn", "check_prompt", "finish_reason", "next_phase_prompt"]
