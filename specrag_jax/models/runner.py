"""ModelRunner: owns parameters, the KV page pool and the jitted steps (the executor the pipeline calls).

Steps arrive as packed chunks (``packing.py``); the pool is donated so it updates in place.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import ATTENTION_IMPLS, KVPool, PageAllocator, make_pool
from specrag_jax.models.packing import Chunk, PackedStep, bucket, pack_chunks
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.sampling import sample_tokens
from specrag_jax.models.scoring import token_logprobs
from specrag_jax.models.transformer import Decoder, logits_at, unstack_layers


@functools.partial(
    jax.jit, static_argnames=("cfg", "impl", "tree", "decode", "greedy_only", "dtype"), donate_argnames=("pool",)
)
def _sample_step(params, pool, tokens, meta, rows, temperature, top_k, top_p, seeds, steps, *, cfg, impl, tree,
                 decode, greedy_only, dtype):
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree, decode).apply({"params": params}, tokens, meta, pool)
    logits = logits_at(params, cfg, hidden[rows])
    ids, logprobs = sample_tokens(logits, temperature, top_k, top_p, seeds, steps, greedy_only=greedy_only)
    return ids, logprobs, pool


@functools.partial(jax.jit, static_argnames=("cfg", "impl", "tree", "decode", "dtype"), donate_argnames=("pool",))
def _score_step(params, pool, tokens, meta, rows, targets, *, cfg, impl, tree, decode, dtype):
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree, decode).apply({"params": params}, tokens, meta, pool)
    return token_logprobs(params, cfg, hidden[rows], targets), pool


@functools.partial(jax.jit, static_argnames=("cfg", "impl", "tree", "decode", "dtype"), donate_argnames=("pool",))
def _logits_step(params, pool, tokens, meta, rows, *, cfg, impl, tree, decode, dtype):
    hidden, pool = Decoder(cfg, jnp.dtype(dtype), impl, tree, decode).apply({"params": params}, tokens, meta, pool)
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
    def pack(self, chunks: Sequence[Chunk], *, token_bucket: int | None = None, min_seqs: int = 1) -> PackedStep:
        """Pad and pack chunks into one step's arrays (see ``packing.pack_chunks``)."""
        return pack_chunks(
            chunks, page_size=self.page_size, num_slots=self.pool.num_pages * self.page_size,
            min_token_bucket=self.min_token_bucket, min_page_bucket=self.min_page_bucket,
            max_page_bucket=bucket(self.max_pages_per_seq), token_bucket=token_bucket, min_seqs=min_seqs,
        )

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
            cfg=self.cfg, impl=self.attention_impl, tree=step.tree, decode=step.decode, greedy_only=greedy_only,
            dtype=self.dtype,
        )
        return np.asarray(ids)[: step.num_rows], np.asarray(logprobs)[: step.num_rows]

    def score(self, step: PackedStep, targets: Sequence[int]) -> np.ndarray:
        """Run the step; log p(targets[i]) at each wanted row i (no full logits array)."""
        tgt = np.zeros(step.rows.shape[0], np.int32)
        tgt[: len(targets)] = targets
        logprobs, self.pool = _score_step(
            self.params, self.pool, step.tokens, step.meta, step.rows, tgt,
            cfg=self.cfg, impl=self.attention_impl, tree=step.tree, decode=step.decode, dtype=self.dtype,
        )
        return np.asarray(logprobs)[: step.num_rows]

    def logits(self, step: PackedStep) -> np.ndarray:
        """Run the step; full float32 logits [rows, vocab] at the wanted rows only (tests, parity checks)."""
        logits, self.pool = _logits_step(
            self.params, self.pool, step.tokens, step.meta, step.rows,
            cfg=self.cfg, impl=self.attention_impl, tree=step.tree, decode=step.decode, dtype=self.dtype,
        )
        return np.asarray(logits)[: step.num_rows]
