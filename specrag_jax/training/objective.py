"""The training forward pass and loss: the Decoder on the reference attention path, one packed row at a time.

Each batch row is one step of the inference contract with an empty cache: its packed examples are separate
attention sequences (``token_seq`` = segment), causal by packed order (``tree=False``), positions restarting per
example, nothing cached (``kv_lens = 0``) and nothing stored (write slots out of range). Rows run under
``vmap``, so attention is ``L x L`` per row, never ``(rows*L)^2``. The loss is next-token cross-entropy on the
target tokens only (``Batch.mask``), computed over row chunks under ``jax.checkpoint`` so the
``[tokens, vocab]`` logits never exist whole.
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp

from specrag_jax.kernels import make_pool
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.transformer import Decoder, logits_at
from specrag_jax.training.lora import lora_applied

LOSS_CHUNK_ROWS = 512  # hidden rows projected to the vocabulary at a time


def row_metadata(segments: jax.Array, positions: jax.Array, max_segments: int) -> AttentionMetadata:
    """Metadata of one packed row: every example its own sequence, no cached prefix, no K/V stored."""
    length = segments.shape[0]
    valid = segments >= 0
    return AttentionMetadata(
        token_seq=jnp.where(valid, segments, 0).astype(jnp.int32),
        positions=positions.astype(jnp.int32),
        parents=jnp.arange(length, dtype=jnp.int32) - 1,  # unused with tree=False
        token_valid=valid,
        write_slots=jnp.full((length,), 2, jnp.int32),  # the 2-slot pool below: out of range = not stored
        page_table=jnp.zeros((max_segments, 1), jnp.int32),
        kv_lens=jnp.zeros((max_segments,), jnp.int32),
    )


def hidden_states(
    params: dict,
    cfg: ModelConfig,
    tokens: jax.Array,
    segments: jax.Array,
    positions: jax.Array,
    *,
    max_segments: int,
    dtype=jnp.float32,
) -> jax.Array:
    """Final-normed hidden states ``[rows, L, hidden]`` of a batch (per-layer params, dense attention: the one
    ``jax.grad`` can reverse)."""
    decoder = Decoder(cfg, jnp.dtype(dtype), "dense", False, False)
    pool = make_pool(cfg.num_layers, 2, 1, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(dtype))

    def one_row(tok, seg, pos):
        meta = row_metadata(seg, pos, max_segments)
        hidden, _ = decoder.apply({"params": params}, tok, meta, pool)
        return hidden

    return jax.vmap(one_row)(tokens, segments, positions)


def masked_nll(
    params: dict, cfg: ModelConfig, hidden: jax.Array, labels: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(sum of -log p(label) over masked rows, number of masked rows), float32, chunked over rows."""
    h = hidden.reshape(-1, hidden.shape[-1])
    y, w = labels.reshape(-1), mask.reshape(-1).astype(jnp.float32)
    n = h.shape[0]
    chunk = min(LOSS_CHUNK_ROWS, n)
    pad = (-n) % chunk
    if pad:
        h = jnp.pad(h, ((0, pad), (0, 0)))
        y, w = jnp.pad(y, (0, pad)), jnp.pad(w, (0, pad))
    h = h.reshape(-1, chunk, h.shape[-1])
    y, w = y.reshape(-1, chunk), w.reshape(-1, chunk)

    @jax.checkpoint
    def chunk_nll(hc, yc, wc):
        logp = jax.nn.log_softmax(logits_at(params, cfg, hc), axis=-1)
        return -jnp.sum(jnp.take_along_axis(logp, yc[:, None], axis=-1)[:, 0] * wc)

    def body(total, xs):
        return total + chunk_nll(*xs), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (h, y, w))
    return total, jnp.sum(w)


def _adapted(adapter: dict | None, scale: float):
    return contextlib.nullcontext() if adapter is None else lora_applied(adapter, scale)


def effective_params(trainable: Any, frozen: Any, mode: str) -> tuple[dict, dict | None]:
    """(decoder params, adapter or None) from the trainable and frozen trees of a mode."""
    if mode == "full":
        return trainable, None
    return frozen, trainable


def batch_nll(
    trainable: Any,
    frozen: Any,
    cfg: ModelConfig,
    batch: dict,
    *,
    mode: str,
    lora_scale: float,
    max_segments: int,
    dtype=jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """(summed target NLL, target count) of a batch dict (``tokens, labels, mask, segments, positions``)."""
    params, adapter = effective_params(trainable, frozen, mode)
    with _adapted(adapter, lora_scale):
        hidden = hidden_states(
            params, cfg, batch["tokens"], batch["segments"], batch["positions"], max_segments=max_segments, dtype=dtype
        )
        return masked_nll(params, cfg, hidden, batch["labels"], batch["mask"])


def mean_loss(trainable: Any, frozen: Any, cfg: ModelConfig, batch: dict, **kw: Any) -> jax.Array:
    """Mean target-token cross-entropy of a batch (0 when it has no target tokens)."""
    total, count = batch_nll(trainable, frozen, cfg, batch, **kw)
    return total / jnp.maximum(count, 1.0)


def row_logits(
    trainable: Any,
    frozen: Any,
    cfg: ModelConfig,
    batch: dict,
    *,
    mode: str,
    lora_scale: float,
    max_segments: int,
    dtype=jnp.float32,
) -> jax.Array:
    """Full ``[rows, L, vocab]`` logits (tests: checkpoint round trips compare these bitwise)."""
    params, adapter = effective_params(trainable, frozen, mode)
    with _adapted(adapter, lora_scale):
        hidden = hidden_states(
            params, cfg, batch["tokens"], batch["segments"], batch["positions"], max_segments=max_segments, dtype=dtype
        )
    return logits_at(params, cfg, hidden.reshape(-1, hidden.shape[-1])).reshape(*hidden.shape[:2], -1)
