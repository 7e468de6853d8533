"""Scheduling policy: token budget and BARS-style backpressure on the prefill chunk size.

After Omnia's BARS: the prefill tokens a step may carry shrink while many sequences are decoding (their
per-token latency would suffer behind long prefill chunks) or the page pool is nearly full (new prompts
would only wait for pages), and grow back when the engine is idle. Chunk sizes stay powers of two, so the
step shapes (and compiled programs) stay few.

Token trees (speculating sequences) shrink the same way: a speculation step packs one tree of B tokens per
sequence (W = its sequence bucket), and B halves from the requests' largest budget while W x B exceeds the
step token budget; below the smallest tree (8) the sequences decode plainly (``tree_budget``). The token
budget is a hard limit of every step, so this holds with backpressure off too.
"""

from __future__ import annotations

import dataclasses

from specrag_jax.errors import SpecRagError
from specrag_jax.models.executor.packing import bucket, seq_count_bucket, token_count_bucket
from specrag_jax.models.speculative.tree import TREE_BUDGETS


@dataclasses.dataclass
class SchedulerConfig:
    """token_budget: most tokens in one step; max_running: sequences decoding at once; max_queue: waiting
    requests before submissions are refused; backpressure off = a fixed prefill chunk of the whole budget."""

    token_budget: int = 256
    min_prefill_chunk: int = 32
    max_running: int = 64
    max_queue: int = 256
    backpressure: bool = True
    busy_decoders: int = 8  # at least this many decoding sequences count as "many"
    low_free_fraction: float = 0.15  # the pool counts as nearly full below this free fraction
    min_step_seqs: int = 4  # sequence-count bucket floor: fewer step shapes (compilations) under mixed load
    min_step_tokens: int = 64  # token-count bucket floor of prefill / mixed steps
    score_step_seqs: int = 8  # sequences (trees + prefix chunks) in a scoring step: its one sequence bucket
    fine_buckets: bool = False  # decode rows / step tokens on the fine ladders (less padding, more shapes)
    prefill_first: bool = False  # a sampling step carries prefill chunks or decode tokens, never both
    sticky_rows: bool = False  # decode / speculation rows never shrink while sequences run (``DecodeWidth``)

    def __post_init__(self) -> None:
        if (
            min(
                self.token_budget,
                self.min_prefill_chunk,
                self.max_running,
                self.max_queue,
                self.min_step_seqs,
                self.min_step_tokens,
                self.score_step_seqs,
            )
            < 1
        ):
            raise SpecRagError(
                "token_budget, min_prefill_chunk, max_running, max_queue, min_step_seqs, "
                "min_step_tokens and score_step_seqs must be >= 1"
            )
        self.score_step_seqs = bucket(self.score_step_seqs)
        self.token_budget = bucket(self.token_budget)
        self.min_prefill_chunk = min(bucket(self.min_prefill_chunk), self.token_budget)

    def decode_rows(self, n: int) -> int:
        """Rows of a decode (or speculation) step of ``n`` sequences: powers of two from ``min_step_seqs``, or
        with ``fine_buckets`` exactly ``n`` up to 8 and then 1.5x steps (``seq_count_bucket``)."""
        return max(seq_count_bucket(n), self.min_step_seqs) if self.fine_buckets else bucket(n, self.min_step_seqs)

    def step_tokens(self, n: int) -> int:
        """Padded tokens of a prefill or scoring step carrying ``n``: powers of two from ``min_step_tokens``, or
        with ``fine_buckets`` 1/16-octave steps above 256 (``token_count_bucket``)."""
        if self.fine_buckets:
            return token_count_bucket(n, self.min_step_tokens)
        return bucket(n, self.min_step_tokens)


class DecodeWidth:
    """Rows of the decode and speculation steps. With ``sticky_rows`` the width keeps its largest value until the
    engine runs nothing: as drafts finish one by one, a batch of five keeps decoding on five rows (one compiled
    shape per generation, padded rows cost little next to the weight reads) instead of compiling 4, 3, 2, 1."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.floor = 0

    def rows(self, n: int) -> int:
        """Rows of a step of ``n`` sequences."""
        r = max(self.cfg.decode_rows(n), self.floor)
        if self.cfg.sticky_rows:
            self.floor = r
        return r

    def idle(self) -> None:
        """Nothing runs: the next batch starts from its own width."""
        self.floor = 0


class Backpressure:
    """The prefill chunk size, adapted once per step."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.chunk = cfg.token_budget

    def update(self, num_decoding: int, free_fraction: float) -> int:
        """New chunk size given how many sequences decode and the pool's free fraction."""
        c = self.cfg
        if not c.backpressure:
            self.chunk = c.token_budget
        elif num_decoding >= c.busy_decoders or free_fraction < c.low_free_fraction:
            self.chunk = max(self.chunk // 2, c.min_prefill_chunk)
        elif num_decoding == 0:
            self.chunk = min(self.chunk * 2, c.token_budget)
        return self.chunk

    def tree_budget(self, num_seqs: int, max_budget: int) -> int | None:
        """The largest tree budget <= ``max_budget`` (a ``TREE_BUDGETS`` entry) for a speculation step of
        ``num_seqs`` trees within the token budget: halved while ``num_seqs * budget > token_budget``; None when
        even the smallest tree does not fit (plain decoding)."""
        b = max_budget
        while b >= TREE_BUDGETS[0] and num_seqs * b > self.cfg.token_budget:
            b //= 2
        return b if b >= TREE_BUDGETS[0] else None
