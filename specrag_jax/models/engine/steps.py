"""Building one engine step from the ready work of all running requests, and handing its results back.

A *sampling* step carries decode tokens (one per decoding sequence, first) and prefill chunks (the rest of
the token budget, at most the backpressure chunk); a prefill chunk that ends its prompt asks for a sampled
row. A *scoring* step carries verification trees (K/V dropped; an engine without a prefix cache puts each tree's
prefix at the head of the tree's chunk, one step where prefill-then-score took two) and prefix-only prefill. A
*speculation* step carries the token trees of the speculating decoding sequences (``spec_steps.py``); those
sequences skip the sampling steps while they have proposals. The kinds that have work take turns (sample,
speculate, score), so none waits more than two steps. All are packed and bucketed by ``ModelRunner.pack``.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from specrag_jax.compile_time import thread_compile_s
from specrag_jax.kernels import chain_parents
from specrag_jax.models.engine.policy import SchedulerConfig
from specrag_jax.models.engine.requests import PhaseError, Request, Seq, TopLogprobs, top_of
from specrag_jax.models.engine.rules import finish_reason, next_phase_prompt
from specrag_jax.models.engine.spec_steps import SpecPlanner, SpecWork
from specrag_jax.models.engine.state import EngineState
from specrag_jax.models.executor.packing import Chunk, bucket
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.speculative.decode import SpeculationStats


def tree_chunk(r: Request) -> Chunk:
    """A score request's chunk: its tree over the prefix's pages, or, with an inline prefix, the prefix as a causal
    chain the tree's roots attach to (nothing stored: one step where prefill-then-score took two)."""
    t, kv_len = r.tree, len(r.prefix_seq.prompt)
    head = list(r.prefix) if r.inline_prefix else []
    n = len(head)
    return Chunk(
        r.prefix_seq.pages,
        kv_len,
        head + t.tokens,
        parents=chain_parents(n).tolist() + [p + n if p >= 0 else n - 1 for p in t.parents],
        positions=list(range(kv_len, kv_len + n)) + list(t.positions),
        write=False,
        rows=[row + n for row in t.rows],
    )


@dataclasses.dataclass
class Work:
    kind: str  # "sample" | "score"
    chunks: list[Chunk]
    row_seqs: list[Seq]  # sample: the sequence of every sampled row
    prefills: list[tuple[Seq, int]]  # (sequence, tokens of its prompt in this step)
    trees: list[Request]  # score: requests whose tree is in this step
    targets: list[int]
    requests: list[Request]
    rows: int = 0  # a sampling decode step's rows (``DecodeWidth``), set when it is built

    @property
    def decodes(self) -> bool:
        """One token per sequence, no tree: a decode step."""
        return all(len(c.tokens) == 1 and c.parents is None for c in self.chunks)

    def run(self, runner: ModelRunner, cfg: SchedulerConfig):
        total = sum(len(c.tokens) for c in self.chunks)
        min_seqs = cfg.min_step_seqs if self.kind == "sample" else cfg.score_step_seqs
        # Bucket floors keep the number of distinct step shapes (each one an XLA compilation) small; a sampling
        # step pads its rows to its sequence bucket, so its shape is (tokens, sequences, pages) only.
        # A decode step's token count is its row count (no padded tokens: each one gathers its KV pages).
        decode = self.decodes
        seqs = (self.rows or cfg.decode_rows(len(self.chunks))) if decode else bucket(len(self.chunks), min_seqs)
        step = runner.pack(
            self.chunks,
            token_bucket=seqs if decode else cfg.step_tokens(total),
            min_seqs=seqs if self.kind == "sample" else min_seqs,
        )
        if self.kind == "score":
            return runner.score(step, self.targets)
        return runner.sample(
            step,
            SamplingBatch.of(
                [s.sampling for s in self.row_seqs],
                [len(s.out) for s in self.row_seqs],
                [s.penalty_slot for s in self.row_seqs],
            ),
        )


KINDS = ("sample", "speculate", "score")  # the turn order of the step kinds


class StepBuilder:
    """Builds an engine's next step from its state's running requests and hands the step's results back."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.spec = SpecPlanner(state)
        self.last_kind = "score"
        self.t_start = 0.0

    def _seqs(self) -> list[Seq]:
        return [s for r in self.state.running for s in r.all_seqs()]

    def build(self) -> Work | SpecWork | None:
        """The next step's work, or None when nothing is ready."""
        eng = self.state
        spec = self.spec.plan([s for s in self._seqs() if s.decoding])  # may fail requests whose proposer raised
        trees = [
            r
            for r in eng.running
            if r.kind == "score"
            and r.prefix_seq is not None
            and not r.prefix_seq.prefilling
            and (r.prefix_seq.pages or r.inline_prefix)
        ]
        seqs = self._seqs()
        skip = set(spec.seqs) if spec is not None else set()
        sampling_work = any((s.decoding and s not in skip) or (s.prefilling and s.sampling is not None) for s in seqs)
        prefix_work = any(s.prefilling and s.sampling is None for s in seqs)
        ready = {"sample": sampling_work or prefix_work, "speculate": spec is not None, "score": bool(trees)}
        start = KINDS.index(self.last_kind) + 1
        kind = next((k for k in KINDS[start:] + KINDS[:start] if ready[k]), None)
        if kind is None:
            return None
        if kind == "speculate":
            work = spec
        elif kind == "score":
            work = self._score(trees, seqs)
        else:
            work = self._sample(seqs, skip)
            if self.spec.fell_back:  # backpressure: no tree fitted the token budget, the trees' sequences join
                eng.counters["spec_plain_fallback_steps"] += 1
        self.last_kind = work.kind
        self.t_start = time.perf_counter()
        return work

    def _prefill_chunks(
        self, seqs: list[Seq], budget: int, with_rows: bool, work: Work, max_chunks: int | None = None
    ) -> None:
        for s in seqs:
            if budget <= 0 or (max_chunks is not None and len(work.chunks) >= max_chunks):
                break
            if not s.prefilling or (not with_rows and s.sampling is not None):
                continue
            n = min(len(s.prompt) - s.prefilled, budget)
            last = s.prefilled + n == len(s.prompt)
            want = last and s.sampling is not None
            work.chunks.append(
                Chunk(s.pages, s.prefilled, s.prompt[s.prefilled : s.prefilled + n], rows=[n - 1] if want else [])
            )
            if want:
                work.row_seqs.append(s)
            work.prefills.append((s, n))
            work.requests.append(s.req)
            budget -= n

    def _sample(self, seqs: list[Seq], skip: set[Seq]) -> Work:
        eng, cfg = self.state, self.state.config
        work = Work("sample", [], [], [], [], [], [])
        cap = bucket(cfg.max_running)  # sequences per sampling step: the largest warmed-up sequence bucket
        decoders = [s for s in seqs if s.decoding and s not in skip][: min(cfg.token_budget, cap)]
        if cfg.prefill_first and any(s.prefilling and s.sampling is not None for s in seqs):
            decoders = []  # decode rows would pay a mixed step's attention (measured: 0.62 -> 1.07 s on CPU)
        for s in decoders:
            work.chunks.append(Chunk(s.pages, len(s.prompt) + len(s.out) - 1, [s.out[-1]], rows=[0]))
            work.row_seqs.append(s)
            work.requests.append(s.req)
        alloc = eng.runner.allocator
        chunk = eng.backpressure.update(len(decoders), alloc.num_free / max(alloc.num_usable, 1))
        self._prefill_chunks(seqs, min(chunk, cfg.token_budget - len(decoders)), True, work, max_chunks=cap)
        if work.chunks and work.decodes:
            work.rows = eng.widths.rows(len(work.chunks))
        return work

    def _score(self, trees: list[Request], seqs: list[Seq]) -> Work:
        cfg = self.state.config
        work = Work("score", [], [], [], [], [], [])
        used = 0
        for r in trees:  # at most score_step_seqs chunks: scoring steps keep one sequence bucket (warmup.py)
            chunk = tree_chunk(r)
            if work.trees and (used + len(chunk.tokens) > cfg.token_budget or len(work.chunks) >= cfg.score_step_seqs):
                break
            work.chunks.append(chunk)
            work.targets.extend(r.tree.targets)
            work.trees.append(r)
            work.requests.append(r)
            used += len(chunk.tokens)
        self._prefill_chunks(seqs, cfg.token_budget - used, False, work, max_chunks=cfg.score_step_seqs)
        return work

    # ------------------------------------------------------------------ results
    def dispatch(self, work: Work, outcome) -> None:
        eng = self.state
        now, compiled = time.perf_counter(), thread_compile_s()  # the step's own compile falls before ``now``
        eng.stage(f"{work.kind}_step", now - self.t_start)
        eng.counters["steps"] += 1
        eng.counters["step_tokens"] += sum(len(c.tokens) for c in work.chunks)
        for s, n in work.prefills:
            s.prefilled += n
            eng.counters["prefill_tokens"] += n
            if s.prefilling:
                continue
            s.prefill_done_at, s.prefill_done_compile_s = now, compiled
            eng.cache.insert(s.prompt, s.pages)
            if s.sampling is None and s.req.kind == "generate" and s.req.prefix_seq is s:
                eng.prefix_ready(s.req)
        if work.kind == "speculate":
            return self.spec.dispatch(work, outcome, now, self._accept)
        if work.kind == "score":
            offset = 0
            for r in work.trees:
                n = len(r.tree.rows)
                r.compile_s = max(compiled - r.admitted_compile_s, 0.0)  # its prefix prefill's and this step's
                eng.complete_score(r, np.asarray(outcome[offset : offset + n], np.float32))
                offset += n
            return
        eng.record_tokens(len(work.row_seqs))
        done: dict[int, Request] = {}
        for row, s in enumerate(work.row_seqs):
            tok, lp = outcome.ids[row], outcome.logprobs[row]
            if s.pages == [] or s.req.future.done():
                continue  # cancelled while the step ran
            if s.spec_stats is not None and s.out:  # a plain decode step of a speculating sequence
                s.spec_stats.record(0, 0, 1)
            try:
                self._accept(
                    s,
                    int(tok),
                    float(lp),
                    now,
                    top_of(outcome.top_ids[row], outcome.top_logprobs[row], s.sampling.top_logprobs),
                )
            except Exception as exc:  # a failed phase transition fails its own request, not the step
                eng.fail(s.req, exc)
                continue
            if all(x.finish is not None for x in s.req.seqs):
                done[id(s.req)] = s.req
        for req in done.values():
            eng.complete(req)

    def _accept(self, s: Seq, token: int, logprob: float, now: float, top: TopLogprobs | None = None) -> None:
        eng, req = self.state, s.req
        s.out.append(token)
        s.logprobs.append(logprob)
        if top is not None:
            s.top_logprobs.append(top)
        if req.on_token is not None:
            try:
                req.on_token(s.branch, token)
            except Exception:  # a broken listener must not stop the engine
                req.on_token = None
        limit, stop_fn = req.phase_limit(s)
        s.finish = finish_reason(token, s.out, s.branch, eng.eos_ids, stop_fn, limit)
        if s.finish is not None:
            s.finished_at, s.finished_compile_s = now, thread_compile_s()
            if s.phase < len(req.phases) - 1:
                self._next_phase(s, now)
            elif s.pages:
                pages, s.pages = s.pages, []
                eng.runner.allocator.release(pages)

    def _next_phase(self, s: Seq, now: float) -> None:
        """Move a branch that ended a phase to the next one, keeping its K/V (``next_phase_prompt``)."""
        req = s.req
        result = self.state.result_of(s)
        prompt, prefilled = next_phase_prompt(s.prompt, s.out, req.between, s.phase, s.branch, result)
        grown = len(prompt) - len(req.prefix) - len(req.suffixes[s.branch])
        budget = sum(ph.max_new_tokens for ph in req.phases[: s.phase + 1]) + req.max_forced_tokens
        if grown > budget:
            raise PhaseError(
                f"phase {s.phase} of branch {s.branch} grows its prompt by {grown} tokens; the request "
                f"reserved {req.max_forced_tokens} forced tokens"
            )
        self.state.check_prompt(prompt, req.phases[s.phase + 1].max_new_tokens)
        s.phase_results.append(result)
        if s.spec_stats is not None:
            s.spec_stats = SpeculationStats()  # each phase's result has its own counts (as a plain phase's)
        s.prompt, s.prefilled = prompt, prefilled
        s.out, s.logprobs, s.top_logprobs, s.finish = [], [], [], None
        s.phase += 1
        s.phase_started_at, s.phase_started_compile_s = now, s.finished_compile_s
