"""Batched generation over the paged pool: chunked prefill, batched decode, EOS and stop conditions."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Collection, Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import pages_needed
from specrag_jax.models.executor.packing import (
    Chunk,
    bucket,
    seq_count_bucket,
    seq_count_buckets,
    token_count_bucket,
    token_count_buckets,
)
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation, SpeculationStats, speculative_decode

StopFn = Callable[[int, list[int]], bool]
BetweenFn = Callable[[int, int, "GenerationResult"], tuple[int, Sequence[int]]]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of ``Generator.generate_phases``: its token budget and stop condition."""

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
    shared_prefix_tokens: int = 0  # prompt tokens whose K/V came from pages shared with other branches
    speculation: SpeculationStats | None = None  # decode-phase counts when the generator speculates
    top_logprobs: list | None = None  # per token (ids, log-probabilities) of the likeliest, when asked (engine)


@dataclasses.dataclass
class _Seq:
    prompt: list[int]
    pages: list[int]
    params: SamplingParams
    out: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    prefilled: int = 0
    finish: str | None = None


def finish_reason(
    token: int, out: list[int], row: int, eos_ids: Collection[int], stop_fn: StopFn | None, max_new: int
) -> str | None:
    """Why a sequence whose newest token is ``token`` (already appended to ``out``) ends: "eos", "stop" (``stop_fn``
    of its ``row``), "length" (``max_new`` tokens), or None. The one rule of the Generator and the serving engine."""
    if token in eos_ids:
        return "eos"
    if stop_fn is not None and stop_fn(row, out):
        return "stop"
    if len(out) >= max_new:
        return "length"
    return None


def next_phase_prompt(
    prompt: list[int], out: list[int], between: BetweenFn | None, phase: int, row: int, result: "GenerationResult"
) -> tuple[list[int], int]:
    """A branch's prompt for its next phase (prompt + kept tokens + forced tokens) and how much of it already
    has K/V in the pool: the old prompt and the kept tokens that were fed back (the last sampled one never is)."""
    keep, forced = between(phase, row, result) if between else (len(out), [])
    keep = max(0, min(int(keep), len(out)))
    valid = len(prompt) + min(keep, max(len(out) - 1, 0))
    new_prompt = prompt + out[:keep] + [int(t) for t in forced]
    return new_prompt, min(valid, len(new_prompt) - 1)


DEFAULT_MAX_PREFILL_TOKENS = 512  # prompt tokens per prefill step (chunked prefill)


class Generator:
    """Generates continuations for a batch of token prompts with one ModelRunner."""

    def __init__(
        self,
        runner: ModelRunner,
        eos_ids: Sequence[int] = (),
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        speculation: Speculation | None = None,
    ) -> None:
        """``speculation``: decode with token-tree speculation (``speculative/decode.py``); None = plain decoding."""
        self.runner = runner
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.max_prefill_tokens = max_prefill_tokens
        self.speculation = speculation

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Raise SpecRagError when a prompt is empty or does not fit the context."""
        if len(prompt) == 0:
            raise SpecRagError("empty prompt: nothing to generate from")
        limit = self.runner.max_seq_len
        if len(prompt) + max_new_tokens > limit:
            raise SpecRagError(
                f"prompt is too long: {len(prompt)} tokens + max_new_tokens {max_new_tokens} exceeds the "
                f"context of {limit} tokens"
            )
        bad = [t for t in prompt if not 0 <= int(t) < self.runner.cfg.vocab_size]
        if bad:
            raise SpecRagError(f"token id {bad[0]} is outside the vocabulary (size {self.runner.cfg.vocab_size})")

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        max_new_tokens: int = 64,
        stop_fn: StopFn | None = None,
        speculation: Speculation | None = None,
    ) -> list[GenerationResult]:
        """Generate up to ``max_new_tokens`` for every prompt; pages are released however it ends.

        ``speculation``: decode with token-tree speculation for this call (default: the generator's own)."""
        [results] = self.generate_phases(
            [], prompts, [Phase(max_new_tokens, stop_fn)], sampling=sampling, speculation=speculation
        )
        return results

    def generate_branches(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        max_new_tokens: int = 64,
        stop_fn: StopFn | None = None,
    ) -> list[GenerationResult]:
        """Generate a continuation of ``prefix + suffix`` for every suffix, in one batch.

        The page-aligned part of the shared prefix is prefilled once and its pages are shared by all branches
        (reference counts); each branch prefills only the prefix remainder (< one page) and its suffix.
        """
        [results] = self.generate_phases(prefix, suffixes, [Phase(max_new_tokens, stop_fn)], sampling=sampling)
        return results

    def generate_phases(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        phases: Sequence["Phase"],
        between: BetweenFn | None = None,
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        speculation: Speculation | None = None,
    ) -> list[list[GenerationResult]]:
        """Like ``generate_branches``, in several phases that keep each branch's K/V between them.

        After phase ``p`` (except the last), ``between(p, row, result)`` returns how many of the phase's
        generated tokens to keep and the tokens to force after them; the next phase prefills only those forced
        tokens (and the last kept one). Returns one list of results per phase. ``speculation`` as in
        ``generate``.
        """
        speculation = speculation or self.speculation
        if not suffixes:
            raise SpecRagError("no prompts given")
        if not phases or any(ph.max_new_tokens < 1 for ph in phases):
            raise SpecRagError("every phase needs max_new_tokens >= 1")
        params = [sampling] * len(suffixes) if isinstance(sampling, SamplingParams) else list(sampling)
        if len(params) != len(suffixes):
            raise SpecRagError(f"{len(params)} sampling settings for {len(suffixes)} prompts")
        prefix = [int(t) for t in prefix]
        for suffix in suffixes:
            self.check_prompt(prefix + list(suffix), phases[0].max_new_tokens)
        ps = self.runner.page_size
        shared_len = (len(prefix) // ps) * ps if len(suffixes) > 1 else 0
        alloc = self.runner.allocator
        shared: list[int] = []
        seqs: list[_Seq] = []
        out: list[list[GenerationResult]] = []
        try:
            shared = alloc.allocate(shared_len // ps)
            for suffix, sp in zip(suffixes, params):
                own = alloc.allocate(
                    pages_needed(len(prefix) + len(suffix) + phases[0].max_new_tokens, ps) - len(shared)
                )
                alloc.retain(shared)
                seqs.append(_Seq(prefix + [int(t) for t in suffix], shared + own, sp, prefilled=shared_len))
            t0 = time.perf_counter()
            if shared_len:
                self._prefill_shared(prefix[:shared_len], shared)
            for p, phase in enumerate(phases):
                if p:
                    self._next_phase(seqs, out[-1], p - 1, phase.max_new_tokens, between)
                    t0 = time.perf_counter()
                self._prefill(seqs, phase.max_new_tokens, phase.stop_fn)
                t1 = time.perf_counter()
                stats = self._decode(seqs, phase.max_new_tokens, phase.stop_fn, speculation)
                t2 = time.perf_counter()
                out.append(
                    [
                        GenerationResult(
                            list(s.out),
                            list(s.logprobs),
                            s.finish or "length",
                            len(s.prompt),
                            t1 - t0,
                            t2 - t1,
                            shared_prefix_tokens=shared_len,
                            speculation=st,
                        )
                        for s, st in zip(seqs, stats)
                    ]
                )
        finally:
            for s in seqs:
                alloc.release(s.pages)
            alloc.release(shared)
        return out

    def _next_phase(
        self, seqs: list[_Seq], results: list[GenerationResult], phase: int, max_new: int, between: BetweenFn | None
    ) -> None:
        """Cut each branch to its kept tokens, append the forced ones and grow its pages for the next phase."""
        ps = self.runner.page_size
        for row, (s, res) in enumerate(zip(seqs, results)):
            s.prompt, s.prefilled = next_phase_prompt(s.prompt, s.out, between, phase, row, res)
            s.out, s.logprobs, s.finish = [], [], None
            self.check_prompt(s.prompt, max_new)
            extra = pages_needed(len(s.prompt) + max_new, ps) - len(s.pages)
            if extra > 0:
                s.pages = s.pages + self.runner.allocator.allocate(extra)

    def score_tree(
        self,
        prefix: Sequence[int],
        tokens: Sequence[int],
        parents: Sequence[int],
        positions: Sequence[int],
        rows: Sequence[int],
        targets: Sequence[int],
    ) -> np.ndarray:
        """log p(targets[i]) at tree row ``rows[i]``: the prefix is written to pages, the token tree (chunk-local
        parents, -1 = attaches to the prefix) is scored without storing its K/V, and the pages are released."""
        runner = self.runner
        pages = runner.allocator.allocate(pages_needed(len(prefix), runner.page_size))
        try:
            runner.score(runner.pack([Chunk(pages, 0, list(prefix), rows=[len(prefix) - 1])]), [0])
            tree = Chunk(pages, len(prefix), tokens, parents=parents, positions=positions, write=False, rows=rows)
            return runner.score(runner.pack([tree]), targets)
        finally:
            runner.allocator.release(pages)

    def _prefill_shared(self, tokens: list[int], pages: list[int]) -> None:
        """Write a shared prefix's K/V into its pages (chunked by the prefill budget; nothing sampled)."""
        for start in range(0, len(tokens), self.max_prefill_tokens):
            piece = tokens[start : start + self.max_prefill_tokens]
            self.runner.score(self.runner.pack([Chunk(pages, start, piece, rows=[len(piece) - 1])]), [0])

    # ------------------------------------------------------------------ internals
    def _accept(self, seq: _Seq, row: int, token: int, logprob: float, max_new: int, stop_fn: StopFn | None):
        seq.out.append(int(token))
        seq.logprobs.append(float(logprob))
        seq.finish = finish_reason(int(token), seq.out, row, self.eos_ids, stop_fn, max_new)

    def _run(
        self,
        chunks: list[Chunk],
        owners: list[_Seq],
        rows_seq: list[int],
        token_bucket: int | None = None,
        min_seqs: int = 1,
    ):
        step = self.runner.pack(chunks, token_bucket=token_bucket, min_seqs=min_seqs)
        sp = [owners[i].params for i in rows_seq]
        if any(p.penalized for p in sp):
            raise SpecRagError("penalties are applied by the serving engine (specrag serve), not by the Generator")
        return self.runner.sample(step, SamplingBatch.of(sp, [len(owners[i].out) for i in rows_seq]))[:2]

    def _prefill(self, seqs: list[_Seq], max_new: int, stop_fn: StopFn | None) -> None:
        pending = list(range(len(seqs)))
        while pending:
            budget = self.max_prefill_tokens
            chunks, rows_seq = [], []
            for i in list(pending):
                if budget <= 0:
                    break
                s = seqs[i]
                n = min(len(s.prompt) - s.prefilled, budget)
                done = s.prefilled + n == len(s.prompt)
                chunks.append(
                    Chunk(s.pages, s.prefilled, s.prompt[s.prefilled : s.prefilled + n], rows=[n - 1] if done else [])
                )
                if done:
                    rows_seq.append(i)
                    pending.remove(i)
                s.prefilled += n
                budget -= n
            # rows padded to the sequence bucket: a step with a partial prompt has the shape warm-up compiled
            ids, lps = self._run(chunks, seqs, rows_seq, min_seqs=bucket(len(chunks)))
            for i, tok, lp in zip(rows_seq, ids, lps):
                self._accept(seqs[i], i, int(tok), float(lp), max_new, stop_fn)

    def _decode(
        self, seqs: list[_Seq], max_new: int, stop_fn: StopFn | None, speculation: Speculation | None
    ) -> list[SpeculationStats | None]:
        # The batch keeps its first bucket while sequences finish: one compiled decode shape per generation.
        width = seq_count_bucket(sum(s.finish is None for s in seqs))
        if speculation is None:
            while any(s.finish is None for s in seqs):
                self._decode_step([i for i, s in enumerate(seqs) if s.finish is None], seqs, max_new, stop_fn, width)
            return [None] * len(seqs)
        stats = [SpeculationStats() for _ in seqs]
        emit = lambda i, tok, lp: self._accept(seqs[i], i, tok, lp, max_new, stop_fn)  # noqa: E731
        plain = lambda active: self._decode_step(active, seqs, max_new, stop_fn, width)  # noqa: E731
        speculative_decode(self.runner, seqs, max_new, speculation, width, emit, plain, stats)
        return stats

    def _decode_step(
        self, active: list[int], seqs: list[_Seq], max_new: int, stop_fn: StopFn | None, width: int
    ) -> None:
        """One plain decode step: one token for each active sequence."""
        chunks = [
            Chunk(seqs[i].pages, len(seqs[i].prompt) + len(seqs[i].out) - 1, [seqs[i].out[-1]], rows=[0])
            for i in active
        ]
        ids, lps = self._run(chunks, seqs, active, token_bucket=width, min_seqs=width)
        for i, tok, lp in zip(active, ids, lps):
            self._accept(seqs[i], i, int(tok), float(lp), max_new, stop_fn)

    def warmup(self, max_prompt_len: int, max_new_tokens: int, batch_sizes: Sequence[int] = (1,)) -> int:
        """Compile every step shape that prompts up to ``max_prompt_len`` can reach; returns how many."""
        r = self.runner
        budget = self.max_prefill_tokens
        page_bucket = lambda n: min(bucket(n, r.min_page_bucket), bucket(r.max_pages_per_seq))  # noqa: E731
        shapes: set[tuple[int, int, int, bool]] = set()  # (tokens, sequences, pages per sequence, decode)
        for length in range(1, max_prompt_len + 1):
            p = page_bucket(pages_needed(length + max_new_tokens, r.page_size))
            sizes = [budget] * ((length - 1) // budget) + [length - budget * ((length - 1) // budget)]
            shapes.update((token_count_bucket(c, r.min_token_bucket), 1, p, c == 1) for c in sizes)
            shapes.add((1, 1, p, True))
        largest = max(batch_sizes)
        if largest > 1:
            max_p = page_bucket(pages_needed(max_prompt_len + max_new_tokens, r.page_size))
            p_buckets = sorted({page_bucket(1 << k) for k in range(max_p.bit_length())})
            t_buckets = token_count_buckets(r.min_token_bucket, budget)
            for p in p_buckets:
                shapes.update((s, s, p, True) for s in seq_count_buckets(largest))  # decode widths
                for s in (1 << k for k in range(bucket(largest).bit_length())):  # prefill: powers of two
                    shapes.update((t, s, p, False) for t in t_buckets if t >= 2 * s)
        for t, s, p, decode in sorted(shapes):
            fake = Chunk([0] * p, 0, [0] if decode else [0, 0], write=False, rows=[0])
            step = r.pack([fake] * s, token_bucket=t, min_seqs=s)
            r.sample(step, SamplingBatch.greedy(s))
        return len(shapes)


def greedy_generate(
    runner: ModelRunner, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_ids: Sequence[int] = ()
) -> list[list[int]]:
    """Convenience: greedy ids for each prompt, batched."""
    gen = Generator(runner, eos_ids)
    return [r.token_ids for r in gen.generate(prompts, SamplingParams(), max_new_tokens)]


__all__ = ["GenerationResult", "Generator", "Phase", "greedy_generate"]
