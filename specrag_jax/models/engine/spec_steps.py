"""Speculation steps: the token trees of all speculating decoding sequences (of any requests) in ONE
``ModelRunner.speculate`` step, and their accepted tokens handed back through the per-token path.

Every build, each decoding sequence of a request with a ``Speculation`` asks its proposer (cached while the
sequence has not moved) for continuations of ``prompt + out``, cut so that accepted tokens + the bonus fit
the phase's ``max_new_tokens`` (as ``models.speculative.decode``). Sequences with proposals are *ready*; the rest
decode in the normal sampling steps. A proposer that raises (or proposes a token outside the vocabulary)
fails its own request only; its pages go back.

The step: W = the sequence bucket of the ready sequences, one budget B for every tree: per sequence the
smallest ``TREE_BUDGETS`` entry holding its trie, capped by its request's ``max_budget``, by backpressure
(``Backpressure.tree_budget``: W x B within the token budget) and by its reserved pages (kv_len + B slots;
admission reserves ``max_budget`` of them); B = the largest of those, trees padded to it. Accepted tokens
go one by one through ``StepBuilder._accept`` (on_token, EOS, stop, length, phase ends): tokens after a stop
are dropped, and the K/V the step compacted beyond is never read.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from specrag_jax.models.engine.policy import SchedulerConfig
from specrag_jax.models.engine.requests import Request, Seq, TopLogprobs, top_of
from specrag_jax.models.engine.state import EngineState
from specrag_jax.models.executor.packing import Chunk, bucket
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.speculative.decode import propose
from specrag_jax.models.speculative.tree import (
    TokenTree,
    build_tree,
    count_trie_nodes,
    fit_budget,
    largest_fitting_budget,
    pad_tree,
    stack_trees,
)

AcceptFn = Callable[[Seq, int, float, float, TopLogprobs | None], None]  # (sequence, token, logprob, now, top)


@dataclasses.dataclass
class SpecWork:
    """One speculation step: a tree of ``budget`` tokens per sequence, ``width`` sequence rows."""

    chunks: list[Chunk]
    seqs: list[Seq]
    trees: list[TokenTree]
    width: int
    budget: int
    requests: list[Request]
    prefills: list = dataclasses.field(default_factory=list)  # none: a speculation step carries trees only
    shrunk: bool = False  # backpressure made the trees smaller than the proposals asked for
    kind: str = "speculate"

    def run(self, runner: ModelRunner, cfg: SchedulerConfig):
        step = runner.pack(self.chunks, token_bucket=self.width * self.budget, min_seqs=self.width)
        return runner.speculate(
            step,
            stack_trees(self.trees),
            SamplingBatch.of(
                [s.sampling for s in self.seqs], [len(s.out) for s in self.seqs], [s.penalty_slot for s in self.seqs]
            ),
        )


class SpecPlanner:
    """Builds speculation steps for one engine and hands their results back."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self._cache: dict[Seq, tuple[tuple[int, int], list[list[int]]]] = {}
        self.fell_back = False  # the last plan had ready sequences but no tree fitted the token budget

    def _proposals(self, s: Seq) -> list[list[int]]:
        key = (s.phase, len(s.out))
        hit = self._cache.get(s)
        if hit is not None and hit[0] == key:
            return hit[1]
        limit, _ = s.req.phase_limit(s)
        props = propose(
            s.req.speculation.proposer_for(s.branch),
            s.prompt + s.out,
            limit - len(s.out) - 1,
            self.state.runner.cfg.vocab_size,
        )
        self._cache[s] = (key, props)
        return props

    def _room(self, s: Seq, kv_len: int) -> int | None:
        """The largest tree budget within the request's cap that the sequence's pages and context hold."""
        r = self.state.runner
        slots = min(len(s.pages) * r.page_size, r.max_seq_len)
        return largest_fitting_budget(kv_len, slots, s.req.speculation.max_budget)

    def plan(self, decoding: list[Seq]) -> SpecWork | None:
        """The speculation step for the ready sequences among ``decoding``, or None (nothing ready, or no tree
        fits the token budget: they decode plainly)."""
        eng = self.state
        cands = [s for s in decoding if s.req.speculation is not None and s.spec_stats is not None]
        keep = set(cands)
        self._cache = {s: v for s, v in self._cache.items() if s in keep}
        self.fell_back = False
        ready: list[tuple[Seq, list[list[int]], int, int]] = []  # (seq, proposals, kv_len, room)
        for s in cands:
            if s.req.future.done() or not s.pages:
                continue  # failed by an earlier sequence's proposer in this loop
            try:
                props = self._proposals(s)
            except Exception as exc:  # the proposer's request fails; the others go on
                eng.fail(s.req, exc)
                continue
            kv_len = len(s.prompt) + len(s.out) - 1
            room = self._room(s, kv_len) if props else None
            if room is not None:
                ready.append((s, props, kv_len, room))
        ready = ready[: bucket(eng.config.max_running)]
        if not ready:
            return None
        width = eng.widths.rows(len(ready))
        cap = eng.backpressure.tree_budget(width, max(room for *_, room in ready))
        if cap is None:
            self.fell_back = True
            return None
        nodes = [count_trie_nodes(props) for _, props, _, _ in ready]
        wanted = [fit_budget(n, min(room, cap)) for n, (*_, room) in zip(nodes, ready)]
        budget = min(max(wanted), min(room for *_, room in ready))
        work = SpecWork([], [], [], width, budget, [])
        work.shrunk = max(wanted) < max(fit_budget(n, room) for n, (*_, room) in zip(nodes, ready))
        vocab = eng.runner.cfg.vocab_size
        for (s, props, kv_len, _), b in zip(ready, wanted):
            tree = pad_tree(build_tree(props, s.out[-1], min(b, budget), vocab_size=vocab), budget)
            work.chunks.append(
                Chunk(s.pages, kv_len, tree.tokens, parents=tree.parents, positions=tree.positions(kv_len))
            )
            work.seqs.append(s)
            work.trees.append(tree)
            work.requests.append(s.req)
        return work

    def dispatch(self, work: SpecWork, outcome, now: float, accept: AcceptFn) -> None:
        """Emit each sequence's accepted tokens and bonus token (stopping where the sequence finishes)."""
        eng = self.state
        _, num_accepted, tokens, logprobs, top_ids, top_lps = outcome
        c = eng.counters
        c["spec_steps"] += 1
        c[f"spec_budget_{work.budget}_steps"] += 1
        c["spec_budget_shrunk_steps"] += work.shrunk
        done: dict[int, Request] = {}
        emitted = 0
        for row, s in enumerate(work.seqs):
            if not s.pages or s.req.future.done():
                continue  # cancelled or failed while the step ran: its pages are (or will be) released
            n, st, phase = int(num_accepted[row]), s.spec_stats, s.phase
            proposed, out = work.trees[row].num_tokens - 1, 0
            try:
                for k in range(n + 1):
                    out += 1
                    accept(
                        s,
                        int(tokens[row, k]),
                        float(logprobs[row, k]),
                        now,
                        top_of(top_ids[row, k], top_lps[row, k], s.sampling.top_logprobs),
                    )
                    if s.finish is not None or s.phase != phase:
                        break  # tokens after a stop are dropped
            except Exception as exc:  # a failed phase transition fails its own request, not the step
                eng.fail(s.req, exc)
                continue
            finally:
                st.record(proposed, n, out)  # the phase's stats object, also when this step ended the phase
                emitted += out
                c["spec_seq_steps"] += 1
                c["spec_proposed"] += proposed
                c["spec_accepted"] += n
            if all(x.finish is not None for x in s.req.seqs):
                done[id(s.req)] = s.req
        c["spec_emitted"] += emitted
        eng.record_tokens(emitted)
        for req in done.values():
            eng.complete(req)
