"""Building blocks of the decoder: RMSNorm, rotary embeddings, gated MLP, paged attention layer."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.kernels import paged_attention, write_kv
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.kernels.sharded import sharded_paged_attention
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.linear import Linear


class RMSNorm(nn.Module):
    """y = x / rms(x) * scale, computed in float32 (scale is multiplicative; see config.py)."""

    eps: float
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """[head_dim // 2] float32 inverse frequencies, computed as Hugging Face does (float32 powers)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / np.power(np.float32(theta), exponents)).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate-half RoPE on [T, heads, head_dim] (Hugging Face layout)."""
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, None, :]
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); act = SiLU (Llama) or tanh-GELU (Gemma's GeGLU)."""

    cfg: ModelConfig
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dense = lambda n, name: Linear(n, use_bias=False, dtype=self.dtype, name=name)  # noqa: E731
        gate = dense(self.cfg.intermediate_size, "gate")(x)
        up = dense(self.cfg.intermediate_size, "up")(x)
        if self.cfg.activation == "gelu_tanh":
            act = jax.nn.gelu(gate, approximate=True)
        else:
            act = jax.nn.silu(gate)
        return dense(self.cfg.hidden_size, "down")(act * up)


class PagedAttention(nn.Module):
    """GQA attention over the cached prefix (this layer's pages) and the chunk; stores the chunk's K/V."""

    cfg: ModelConfig
    window: int = 0
    rope_theta: float = 10000.0
    dtype: jnp.dtype = jnp.float32
    attention_impl: str = "reference"
    tree: bool = False
    decode: bool = False
    attention_mesh: Any = None  # a jax Mesh: run the attention kernel per device (shard_map over heads)

    @nn.compact
    def __call__(
        self, x: jax.Array, meta: AttentionMetadata, k_pool: jax.Array, v_pool: jax.Array, plan=None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        cfg = self.cfg
        t = x.shape[0]
        dense = lambda n, name, bias=False: Linear(n, use_bias=bias, dtype=self.dtype, name=name)  # noqa: E731
        qkv_bias = cfg.attention_bias
        q = dense(cfg.num_heads * cfg.head_dim, "q", qkv_bias)(x).reshape(t, cfg.num_heads, cfg.head_dim)
        k = dense(cfg.num_kv_heads * cfg.head_dim, "k", qkv_bias)(x).reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = dense(cfg.num_kv_heads * cfg.head_dim, "v", qkv_bias)(x).reshape(t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = RMSNorm(cfg.rms_norm_eps, name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, name="k_norm")(k)
        inv_freq = jnp.asarray(rope_inv_freq(cfg.head_dim, self.rope_theta))
        q = apply_rope(q, meta.positions, inv_freq)
        k = apply_rope(k, meta.positions, inv_freq)
        # Write first, then read: the pool flows through one scatter (in place on the donated buffer) and the
        # attention reads the updated pool. Reading before writing made XLA copy the whole pool every step.
        # The new slots are >= kv_len, which the attention masks out of the prefix part.
        k_pool = write_kv(k_pool, k, meta.write_slots)
        v_pool = write_kv(v_pool, v, meta.write_slots)
        attend = paged_attention
        if self.attention_mesh is not None:
            attend = functools.partial(sharded_paged_attention, mesh=self.attention_mesh)
        out = attend(
            q,
            k,
            v,
            k_pool,
            v_pool,
            meta,
            scale=cfg.attn_scale,
            window=self.window,
            softcap=cfg.attn_logit_softcap,
            tree=self.tree,
            decode=self.decode,
            impl=self.attention_impl,
            plan=plan,
        )
        out = dense(cfg.hidden_size, "o")(out.reshape(t, cfg.num_heads * cfg.head_dim))
        return out, k_pool, v_pool
