"""A model as plain JAX for researchers' own code: its Flax module, parameter pytree and tokenizer, and pure
functions from ``(params, token_ids)`` to hidden states, logits and log-probabilities, with no page pool to set up.

The functions run the engine's own ``Decoder`` (not a second transformer) on the attention contract with nothing
cached: each batch row is one sequence, causal by position, no prefix (``kv_lens = 0``) and nothing stored (write
slots past a two-slot pool that is never read). Attention is the ``dense`` reference path, the one ``jax.grad``
can reverse (training's path too), so every function works under the caller's ``jax.jit``, ``jax.grad`` and
``jax.vmap``. Rows run under ``vmap``: attention is ``seq x seq`` per row.

Padding is any pattern a ``mask`` describes (right or left): a token sees the earlier unmasked tokens of its own
row, and positions count unmasked tokens only, so a padded row gives the logits of the unpadded sequence.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import make_pool
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.scoring import token_logprobs
from specrag_jax.models.decoder.transformer import Decoder, init_params, logits_at, unstack_layers
from specrag_jax.models.loading.load import check_dtype, load_model_params
from specrag_jax.models.tokenizer.base import Tokenizer
from specrag_jax.models.tokenizer.load import load_tokenizer

_NO_SLOT = 2  # write slot past the 2-slot pool below: nothing is stored


def _concrete(x: Any) -> np.ndarray | None:
    """``x`` as numpy when it holds values, None when it is traced (under the caller's jit or grad)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _row_metadata(valid: jax.Array) -> AttentionMetadata:
    """One row as one sequence with an empty cache: positions count the unmasked tokens, nothing is stored."""
    length = valid.shape[0]
    return AttentionMetadata(
        token_seq=jnp.zeros(length, jnp.int32),
        positions=jnp.maximum(jnp.cumsum(valid.astype(jnp.int32)) - 1, 0),
        parents=jnp.arange(length, dtype=jnp.int32) - 1,  # unused: the chunk is causal by order (tree=False)
        token_valid=valid,
        write_slots=jnp.full(length, _NO_SLOT, jnp.int32),
        page_table=jnp.zeros((1, 1), jnp.int32),
        kv_lens=jnp.zeros(1, jnp.int32),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionalModel:
    """A loaded model for JAX code: ``module`` (the Flax ``Decoder``), ``params`` (its per-layer pytree, what
    ``module.apply({"params": params}, ...)`` takes), ``tokenizer`` and ``config``.

    Every method taking ``params`` is a pure function of its arguments (this object only fixes the architecture),
    so ``jax.jit(fm.logits)`` or ``jax.grad(fm.sequence_log_prob)`` work as they are. ``token_ids`` is an int
    ``[batch, seq]`` array; ``mask`` (same shape, default all True) marks real tokens, padding False.
    """

    module: Decoder
    params: dict
    config: ModelConfig
    tokenizer: Tokenizer | None = None

    @classmethod
    def load(cls, name_or_path: str, *, dtype: str = "float32", cache: bool = True) -> "FunctionalModel":
        """A registry name (``smollm2-135m-instruct``), a ``.gguf`` file or a Hugging Face folder, loaded as
        ``TextModel.load`` loads it (the same converted-weights cache), with its tokenizer."""
        cfg, params = load_model_params(name_or_path, dtype=dtype, cache=cache)
        return cls.from_config(cfg, params, tokenizer=load_tokenizer(name_or_path), dtype=dtype)

    @classmethod
    def from_config(
        cls,
        cfg: ModelConfig,
        params: dict | None = None,
        *,
        seed: int = 0,
        tokenizer: Tokenizer | None = None,
        dtype: str = "float32",
    ) -> "FunctionalModel":
        """A model of ``cfg`` with ``params`` (stacked loader layout or per-layer), or random ones from ``seed``
        (``decoder.init_params``; ``models.config.tiny_config`` makes small configs for tests)."""
        jdtype = check_dtype(dtype)
        if params is None:
            params = init_params(cfg, seed, jdtype)
        params = unstack_layers(params, cfg.num_layers)
        return cls(Decoder(cfg, jdtype, "dense", False, False), params, cfg, tokenizer)

    # ------------------------------------------------------------------ pure functions of (params, inputs)
    def hidden_states(self, params: dict, token_ids: Any, mask: Any = None) -> jax.Array:
        """Final-normed hidden states ``[batch, seq, hidden]`` (padding rows are not meaningful)."""
        return self._hidden(params, *self._inputs(token_ids, mask))

    def _hidden(self, params: dict, token_ids: jax.Array, mask: jax.Array) -> jax.Array:
        cfg, dtype = self.config, self.module.dtype
        pool = make_pool(cfg.num_layers, 2, 1, cfg.num_kv_heads, cfg.head_dim, dtype)  # never read: no prefix

        def one_row(tokens: jax.Array, valid: jax.Array) -> jax.Array:
            hidden, _ = self.module.apply({"params": params}, tokens, _row_metadata(valid), pool)
            return hidden

        return jax.vmap(one_row)(token_ids, mask)

    def logits(self, params: dict, token_ids: Any, mask: Any = None) -> jax.Array:
        """float32 next-token logits ``[batch, seq, vocab]``: row ``t`` predicts token ``t + 1``; 0 at padding."""
        token_ids, mask = self._inputs(token_ids, mask)
        hidden = self._hidden(params, token_ids, mask)
        b, s, h = hidden.shape
        out = logits_at(params, self.config, hidden.reshape(b * s, h)).reshape(b, s, -1)
        return jnp.where(mask[..., None], out, 0.0)

    def token_log_probs(self, params: dict, token_ids: Any, mask: Any = None) -> jax.Array:
        """float32 ``[batch, seq]``: ``log p(token_ids[:, t] | the row's earlier unmasked tokens)``; 0 where
        ``t`` is padding or the row's first token (nothing predicts it). The vocabulary is projected in chunks
        (``decoder.scoring``), never as a ``[tokens, vocab]`` array."""
        return self._token_log_probs(params, *self._inputs(token_ids, mask))

    def _token_log_probs(self, params: dict, token_ids: jax.Array, mask: jax.Array) -> jax.Array:
        hidden = self._hidden(params, token_ids, mask)
        b, s, h = hidden.shape
        # The prediction of token t comes from the previous unmasked token, wherever padding put it.
        idx = jnp.broadcast_to(jnp.arange(s), (b, s))
        last = jax.lax.cummax(jnp.where(mask, idx, -1), axis=1)  # latest unmasked index at or before t
        prev = jnp.concatenate([jnp.full((b, 1), -1), last[:, :-1]], axis=1)
        rows = jnp.take_along_axis(hidden, jnp.maximum(prev, 0)[..., None], axis=1)
        logp = token_logprobs(params, self.config, rows.reshape(b * s, h), token_ids.reshape(-1)).reshape(b, s)
        return jnp.where(mask & (prev >= 0), logp, 0.0)

    def sequence_log_prob(self, params: dict, token_ids: Any, target_mask: Any, mask: Any = None) -> jax.Array:
        """float32 ``[batch]``: the summed log-probability of the tokens ``target_mask`` marks (an answer) given
        everything before them in the row (its prompt), e.g. from ``prompt_answer_batch``."""
        token_ids, mask = self._inputs(token_ids, mask)
        target_mask = jnp.asarray(target_mask)
        if target_mask.shape != token_ids.shape:
            raise SpecRagError(
                f"target_mask has shape {target_mask.shape}, token_ids {token_ids.shape}: they must match"
            )
        logp = self._token_log_probs(params, token_ids, mask)
        return jnp.sum(jnp.where(target_mask.astype(bool), logp, 0.0), axis=1)

    # ------------------------------------------------------------------ host-side helpers
    def prompt_answer_batch(
        self, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], length: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(token_ids, mask, target_mask)`` numpy arrays of ``prompt + answer`` rows, right-padded to
        ``length`` (default the longest row; a fixed one keeps the caller's jit on one compiled shape)."""
        if len(prompts) != len(answers) or not prompts:
            raise SpecRagError(f"need as many prompts as answers, at least one (got {len(prompts)}, {len(answers)})")
        rows = [(list(p), list(a)) for p, a in zip(prompts, answers)]
        longest = max(len(p) + len(a) for p, a in rows)
        length = longest if length is None else length
        if longest > length:
            raise SpecRagError(f"a prompt + answer row has {longest} tokens, more than length={length}")
        token_ids = np.zeros((len(rows), length), np.int32)
        mask = np.zeros((len(rows), length), bool)
        target = np.zeros((len(rows), length), bool)
        for i, (p, a) in enumerate(rows):
            token_ids[i, : len(p) + len(a)] = p + a
            mask[i, : len(p) + len(a)] = True
            target[i, len(p) : len(p) + len(a)] = True
        return token_ids, mask, target

    def _inputs(self, token_ids: Any, mask: Any) -> tuple[jax.Array, jax.Array]:
        """Checked ``[batch, seq]`` int32 ids and bool mask; id ranges are checked when the ids hold values."""
        ids = jnp.asarray(token_ids)
        if ids.ndim != 2:
            raise SpecRagError(f"token_ids must be [batch, seq] (rank 2), got shape {ids.shape}")
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise SpecRagError(f"token_ids must be integers, got {ids.dtype}")
        if ids.shape[1] > self.config.max_position_embeddings:
            raise SpecRagError(
                f"{ids.shape[1]} tokens per row, more than the model's {self.config.max_position_embeddings}"
            )
        values = _concrete(token_ids)
        vocab = self.config.vocab_size
        if values is not None and values.size and (values.min() < 0 or values.max() >= vocab):
            bad = int(values.min()) if values.min() < 0 else int(values.max())
            raise SpecRagError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        mask = jnp.ones(ids.shape, bool) if mask is None else jnp.asarray(mask)
        if mask.shape != ids.shape:
            raise SpecRagError(f"mask has shape {mask.shape}, token_ids {ids.shape}: they must match")
        return ids.astype(jnp.int32), mask.astype(bool)
