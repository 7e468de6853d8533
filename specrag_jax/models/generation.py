"""Generator: the synchronous face of the engine (``models/engine``), the executor interface the pipeline calls.

ask, eval, generate, the Python API and the server all generate through one continuous-batching core. A
``Generator`` built from a runner owns an engine without a thread and runs its step loop on the caller's thread
(``Engine.drive``) until the call's request is done; ``Generator.over(engine, ctx)`` submits to an engine that
runs its own loop (the server's, shared by concurrent requests) and blocks on the request's future, under
``ctx``'s deadline and cancellation. Both have the same methods and the same greedy output.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specrag_jax.kernels import pages_needed
from specrag_jax.models.engine.context import PrefillHandle, RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.policy import SchedulerConfig
from specrag_jax.models.engine.requests import Request, Tree
from specrag_jax.models.engine.rules import BetweenFn, GenerationResult, Phase, StopFn, finish_reason
from specrag_jax.models.engine.warmup import step_shapes, warmup
from specrag_jax.models.executor.packing import bucket
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation

DEFAULT_MAX_PREFILL_TOKENS = 512  # prompt tokens per step (chunked prefill)


def offline_config(runner: ModelRunner, max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS) -> SchedulerConfig:
    """The scheduler settings of a caller-driven engine: the whole token budget for prefill (no other clients'
    latency to protect, so no backpressure), no padding floors (a lone sequence decodes in a one-row step) and the
    fine bucket ladders (five drafts decode on five rows; a 300-token prompt pads to 320, not 512), and prefill
    before decoding (a decode row in a prefill step makes the CPU's attention of every sequence pay for the
    longest chunk: a 512-token step of 5 sequences took 1.50 s against 0.44 s for its 2 prefill chunks alone), and
    a decode width that does not shrink as drafts finish (one compiled decode shape per batch, not five)."""
    return SchedulerConfig(
        token_budget=max_prefill_tokens,
        backpressure=False,
        min_step_seqs=1,
        min_step_tokens=runner.min_token_bucket,
        score_step_seqs=1,
        fine_buckets=True,
        prefill_first=True,
        sticky_rows=True,
    )


class Generator:
    """Generates continuations of token prompts (in batches, with shared prefixes, in phases) and scores token
    trees on one model, through an engine."""

    def __init__(
        self,
        runner: ModelRunner,
        eos_ids: Sequence[int] = (),
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        speculation: Speculation | None = None,
        *,
        prefix_cache: bool = False,
        name: str = "model",
        engine: Engine | None = None,
        ctx: RequestContext | None = None,
    ) -> None:
        """An engine of its own on ``runner``, driven on the caller's thread, or ``engine`` (``over``).
        ``speculation``: decode with token trees by default; ``prefix_cache``: keep finished prompts' pages for
        later calls (radix cache); ``ctx``: the deadline, cancellation and events of its calls."""
        if engine is None:
            config = offline_config(runner, max_prefill_tokens)
            engine = Engine(runner, eos_ids, name=name, config=config, prefix_cache=prefix_cache)
        self.engine, self.ctx, self.role, self.speculation = engine, ctx or RequestContext(), name, speculation
        self.runner = engine.runner
        self.eos_ids = engine.eos_ids
        self.max_prefill_tokens = engine.config.token_budget

    @classmethod
    def over(
        cls, engine: Engine, ctx: RequestContext | None = None, role: str = "", speculation: Speculation | None = None
    ) -> "Generator":
        """A generator submitting to ``engine`` (started: its own loop; else driven by the caller) under ``ctx``."""
        return cls(engine.runner, speculation=speculation, name=role or engine.name, engine=engine, ctx=ctx)

    def check_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Raise SpecRagError when a prompt is empty, out of the vocabulary or does not fit the context."""
        self.engine.check_prompt(prompt, max_new_tokens)

    def _call(self, submit):
        """Submit under the context's deadline and wait for the result (driving the loop when nobody else does)."""
        if self.engine.started:
            return self.ctx.wait(submit)
        req = self.ctx.track(submit)
        try:
            return self.engine.drive(req)
        finally:
            self.ctx.untrack(req)

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
        return self.generate_branches([], prompts, sampling, max_new_tokens, stop_fn, speculation)

    def generate_branches(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        max_new_tokens: int = 64,
        stop_fn: StopFn | None = None,
        speculation: Speculation | None = None,
    ) -> list[GenerationResult]:
        """Generate a continuation of ``prefix + suffix`` for every suffix, in one batch: the page-aligned part of
        the shared prefix is prefilled once and its pages are shared by all branches (reference counts)."""
        self.ctx.emit({"event": "stage", "stage": f"{self.role}_generate", "branches": len(suffixes)})
        spec = speculation or self.speculation
        return self._call(
            lambda t: self.engine.submit_generate(
                prefix, suffixes, sampling, max_new_tokens, stop_fn, timeout=t, speculation=spec
            )
        )

    def generate_phases(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        phases: Sequence[Phase],
        between: BetweenFn | None = None,
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        speculation: Speculation | None = None,
    ) -> list[list[GenerationResult]]:
        """Like ``generate_branches``, in several phases that keep each branch's K/V between them.

        After phase ``p`` (except the last), ``between(p, row, result)`` returns how many of the phase's
        generated tokens to keep and the tokens to force after them; the next phase prefills only those forced
        tokens (and the last kept one). Returns one list of results per phase."""
        self.ctx.emit(
            {"event": "stage", "stage": f"{self.role}_generate", "branches": len(suffixes), "phases": len(phases)}
        )
        spec = speculation or self.speculation
        return self._call(
            lambda t: self.engine.submit_phases(
                prefix, suffixes, phases, between, sampling, timeout=t, speculation=spec
            )
        )

    def start_prefill(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]]) -> PrefillHandle:
        """Prefill ``prefix + suffix`` for every suffix into the prefix cache without waiting for it (progressive
        prefill): one request under the usual admission, one sampled token per branch (discarded), its pages
        back to the pool (cache-held) at its end. A caller-driven engine runs it when the handle is waited on."""
        self.ctx.emit({"event": "stage", "stage": f"{self.role}_prefill", "branches": len(suffixes)})
        req = self.ctx.track(lambda t: self.engine.submit_generate(prefix, suffixes, SamplingParams(), 1, timeout=t))
        return PrefillHandle(self.ctx, req, None if self.engine.started else self.engine.drive)

    def score_tree(
        self,
        prefix: Sequence[int],
        tokens: Sequence[int],
        parents: Sequence[int],
        positions: Sequence[int],
        rows: Sequence[int],
        targets: Sequence[int],
        counts: dict | None = None,
    ) -> np.ndarray:
        """log p(targets[i]) at tree row ``rows[i]``: the prefix is written to pages, the token tree (chunk-local
        parents, -1 = attaches to the prefix) is scored without storing its K/V. ``counts`` (a dict) gets
        ``cached_tokens``: the prefix tokens the prefix cache served (not computed), and ``compile_s``: the
        one-time XLA seconds the engine's thread spent while the request ran (on whichever thread steps it)."""
        self.ctx.emit({"event": "stage", "stage": f"{self.role}_score", "tree_tokens": len(tokens)})
        tree = Tree(list(tokens), list(parents), list(positions), list(rows), list(targets))
        submitted: list[Request] = []

        def submit(timeout: float | None) -> Request:
            submitted.append(self.engine.submit_score(prefix, tree, timeout=timeout))
            return submitted[-1]

        logprobs = self._call(submit)
        if counts is not None:
            counts["cached_tokens"] = submitted[-1].cached_tokens
            counts["compile_s"] = submitted[-1].compile_s
        return logprobs

    def warmup(self, max_prompt_len: int, max_new_tokens: int, batch_sizes: Sequence[int] = (1,)) -> int:
        """Compile every greedy step shape that calls with prompts up to ``max_prompt_len`` tokens, up to
        ``max_new_tokens`` new ones and batches of ``batch_sizes`` can reach; returns how many."""
        r, most = self.runner, max(batch_sizes)
        max_pages = bucket(pages_needed(max_prompt_len + max_new_tokens, r.page_size), r.min_page_bucket)
        shapes = [
            s
            for s in step_shapes(self.engine, "full", sampled=False, score=False)
            if s.seqs <= bucket(most) and s.pages <= max_pages and s.tokens <= bucket(max_prompt_len * most)
        ]
        report = warmup(self.engine, shapes=shapes)
        return report.programs


def greedy_generate(
    runner: ModelRunner, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_ids: Sequence[int] = ()
) -> list[list[int]]:
    """Convenience: greedy ids for each prompt, batched."""
    gen = Generator(runner, eos_ids)
    return [r.token_ids for r in gen.generate(prompts, SamplingParams(), max_new_tokens)]


__all__ = [
    "BetweenFn",
    "GenerationResult",
    "Generator",
    "Phase",
    "StopFn",
    "finish_reason",
    "greedy_generate",
    "offline_config",
]
