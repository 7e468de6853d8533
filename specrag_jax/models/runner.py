"""ModelRunner: owns parameters, the KV page pool and the jitted step; packs chunks into bucketed steps.

A *chunk* is the new tokens of one sequence in a step (a prompt piece, one decode token, or a token tree
for verification). The runner pads the packed tokens, sequence count and page-table width to buckets so
the number of compiled programs stays small and fixed, and donates the pool so it updates in place.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import ATTENTION_IMPLS, NULL_PAGE, AttentionMetadata, KVPool, PageAllocator, make_pool
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.sampling import sample_tokens
from specrag_jax.models.scoring import token_logprobs
from specrag_jax.models.transformer import Decoder, logits_at, unstack_layers


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(n, minimum, 1)
    return 1 << (n - 1).bit_length()


@dataclasses.dataclass
class Chunk:
    """New tokens of one sequence in one step.

    pages: the sequence's pages (enough for kv_len + len(tokens) when ``write``).
    parents: chunk-local parent of each token (-1 = attaches to the cached prefix); default a causal chain.
    positions: RoPE positions; default ``kv_len + arange``.
    write: store this chunk's K/V in the pool at logical slots kv_len.. (False for throw-away trees).
    rows: chunk-local token indices whose next-token distribution is wanted (sampling or scoring).
    """

    pages: Sequence[int]
    kv_len: int
    tokens: Sequence[int]
    parents: Sequence[int] | None = None
    positions: Sequence[int] | None = None
    write: bool = True
    rows: Sequence[int] = ()


@dataclasses.dataclass
class PackedStep:
    tokens: np.ndarray
    meta: AttentionMetadata
    rows: np.ndarray  # packed indices of the wanted rows, padded
    num_rows: int
    tree: bool


@functools.partial(
    jax.jit, static_argnames=("cfg", "impl", "tree", "greedy_only", "dtype"), donate_argnames=("pool",)
)
def _sample_step(params, pool, tokens, meta, rows, temperature, top_k, top_p, seeds, steps, *, cfg, impl, tree,
                 greedy_only, dtype):
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree).apply({"params": params}, tokens, meta, pool)
    logits = logits_at(params, cfg, hidden[rows])
    ids, logprobs = sample_tokens(logits, temperature, top_k, top_p, seeds, steps, greedy_only=greedy_only)
    return ids, logprobs, pool


@functools.partial(jax.jit, static_argnames=("cfg", "impl", "tree", "dtype"), donate_argnames=("pool",))
def _score_step(params, pool, tokens, meta, rows, targets, *, cfg, impl, tree, dtype):
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree).apply({"params": params}, tokens, meta, pool)
    return token_logprobs(params, cfg, hidden[rows], targets), pool


@functools.partial(jax.jit, static_argnames=("cfg", "impl", "tree", "dtype"), donate_argnames=("pool",))
def _logits_step(params, pool, tokens, meta, rows, *, cfg, impl, tree, dtype):
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree).apply({"params": params}, tokens, meta, pool)
    return logits_at(params, cfg, hidden[rows]), pool


class ModelRunner:
    """Executes packed steps of one model over its page pool (the small executor the pipeline calls)."""

    def __init__(
        self,
        cfg: ModelConfig,
        params: dict,
        *,
        num_pages: int = 512,
        page_size: int = 16,
        max_seq_len: int = 2048,
        attention_impl: str = "reference",
        min_token_bucket: int = 16,
        min_page_bucket: int = 16,
    ) -> None:
        if attention_impl not in ATTENTION_IMPLS:
            raise SpecRagError(f"unknown attention_impl {attention_impl!r}; choose one of {ATTENTION_IMPLS}")
        self.cfg = cfg
        # Commit parameters and pool to one device: jit keys its cache on placement, and the steps' outputs
        # are committed, so uncommitted inputs would compile every program a second time.
        self.device = jax.devices()[0]
        self.params = jax.device_put(unstack_layers(params, cfg.num_layers), self.device)
        self.dtype = str(jax.tree_util.tree_leaves(params)[0].dtype)
        self.page_size = page_size
        self.max_seq_len = min(max_seq_len, cfg.max_position_embeddings)
        self.max_pages_per_seq = -(-self.max_seq_len // page_size)
        self.attention_impl = attention_impl
        self.min_token_bucket = min_token_bucket
        self.min_page_bucket = min(min_page_bucket, bucket(self.max_pages_per_seq))
        self.pool: KVPool = jax.device_put(
            make_pool(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(self.dtype)),
            self.device,
        )
        self.allocator = PageAllocator(num_pages)

    # ---------------------------------------------------------------- packing
    def pack(self, chunks: Sequence[Chunk], *, token_bucket: int | None = None) -> PackedStep:
        """Pad and pack chunks into one step's arrays (host side, numpy)."""
        if not chunks:
            raise SpecRagError("a step needs at least one chunk")
        total = sum(len(c.tokens) for c in chunks)
        t_pad = token_bucket or bucket(total, self.min_token_bucket)
        s_pad = bucket(len(chunks))
        widest = max(max(len(c.pages), 1) for c in chunks)
        p_pad = min(bucket(widest, self.min_page_bucket), bucket(self.max_pages_per_seq))
        drop = self.pool.num_pages * self.page_size  # any slot >= this is not written
        tokens = np.zeros(t_pad, np.int32)
        token_seq = np.zeros(t_pad, np.int32)
        positions = np.zeros(t_pad, np.int32)
        parents = np.full(t_pad, -1, np.int32)
        valid = np.zeros(t_pad, bool)
        write_slots = np.full(t_pad, drop, np.int32)
        page_table = np.full((s_pad, p_pad), NULL_PAGE, np.int32)
        kv_lens = np.zeros(s_pad, np.int32)
        rows: list[int] = []
        tree = False
        start = 0
        for s, c in enumerate(chunks):
            n = len(c.tokens)
            end = start + n
            page_table[s, : len(c.pages)] = c.pages
            kv_lens[s] = c.kv_len
            tokens[start:end] = c.tokens
            token_seq[start:end] = s
            valid[start:end] = True
            positions[start:end] = c.positions if c.positions is not None else c.kv_len + np.arange(n)
            local = np.arange(n) - 1 if c.parents is None else np.asarray(c.parents, np.int64)
            if c.parents is not None and np.any(local != np.arange(n) - 1):
                tree = True
            parents[start:end] = np.where(local < 0, -1, local + start)
            if c.write:
                logical = c.kv_len + np.arange(n)
                page_ids = np.asarray(c.pages, np.int64)[logical // self.page_size]
                write_slots[start:end] = page_ids * self.page_size + logical % self.page_size
            rows.extend(start + int(r) for r in c.rows)
            start = end
        r_pad = bucket(max(len(rows), 1))
        row_arr = np.zeros(r_pad, np.int32)
        row_arr[: len(rows)] = rows
        meta = AttentionMetadata(
            token_seq=token_seq, positions=positions, parents=parents, token_valid=valid,
            write_slots=write_slots, page_table=page_table, kv_lens=kv_lens,
        )
        return PackedStep(tokens, meta, row_arr, len(rows), tree)

    # ---------------------------------------------------------------- execution
    def sample(self, step: PackedStep, temperature, top_k, top_p, seeds, steps) -> tuple[np.ndarray, np.ndarray]:
        """Run the step and sample one token per wanted row; returns (ids, logprobs) for the real rows."""
        r = step.rows.shape[0]
        pad = lambda a, dt: np.resize(np.asarray(a, dt), r) if len(a) else np.zeros(r, dt)  # noqa: E731
        temperature = pad(temperature, np.float32)
        greedy_only = bool(np.all(temperature[: step.num_rows] == 0))
        ids, logprobs, self.pool = _sample_step(
            self.params, self.pool, step.tokens, step.meta, step.rows, temperature,
            pad(top_k, np.int32), pad(top_p, np.float32), pad(seeds, np.uint32), pad(steps, np.int32),
            cfg=self.cfg, impl=self.attention_impl, tree=step.tree, greedy_only=greedy_only, dtype=self.dtype,
        )
        return np.asarray(ids)[: step.num_rows], np.asarray(logprobs)[: step.num_rows]

    def score(self, step: PackedStep, targets: Sequence[int]) -> np.ndarray:
        """Run the step; log p(targets[i]) at each wanted row i (no full logits array)."""
        tgt = np.zeros(step.rows.shape[0], np.int32)
        tgt[: len(targets)] = targets
        logprobs, self.pool = _score_step(
            self.params, self.pool, step.tokens, step.meta, step.rows, tgt,
            cfg=self.cfg, impl=self.attention_impl, tree=step.tree, dtype=self.dtype,
        )
        return np.asarray(logprobs)[: step.num_rows]

    def logits(self, step: PackedStep) -> np.ndarray:
        """Run the step; full float32 logits [rows, vocab] at the wanted rows only (tests, parity checks)."""
        logits, self.pool = _logits_step(
            self.params, self.pool, step.tokens, step.meta, step.rows,
            cfg=self.cfg, impl=self.attention_impl, tree=step.tree, dtype=self.dtype,
        )
        return np.asarray(logits)[: step.num_rows]
