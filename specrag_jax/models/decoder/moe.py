"""Sparse mixture-of-experts feed-forward block (Mixtral): top-k router, tokens sorted by expert, grouped SwiGLU.

Parameters (one layer; stacked loaders add a leading ``[L]`` axis, as for the dense MLP in config.py)::

    "mlp": {
      "router": {"kernel": [hidden, experts]},                # HF mlp.gate.weight.T / GGUF ffn_gate_inp
      "gate":   {"kernel": [experts, hidden, intermediate]},  # w1 (HF gate_up_proj[:, :I]) / ffn_gate_exps
      "up":     {"kernel": [experts, hidden, intermediate]},  # w3 (HF gate_up_proj[:, I:]) / ffn_up_exps
      "down":   {"kernel": [experts, intermediate, hidden]},  # w2 (HF down_proj) / ffn_down_exps
    }

Routing (transformers' ``MixtralTopKRouter``): logits = x @ router in the compute dtype; probabilities =
softmax(logits) in float32; the top k of the probabilities (``jax.lax.top_k``: on equal values the lower
expert index wins) renormalised to sum to 1, kept in float32. Equal to a softmax over the k chosen logits.
Selecting on the float32 probabilities (not the logits) matches transformers where distinct logits round to
one probability. torch's CPU ``topk`` breaks exact ties its own way (e.g. all-equal -> highest indices), so
on exact ties (a zero router, equal bf16 logits) the chosen experts may differ from transformers'.

Capacity: none (dropless). Every token reaches all k of its experts: the grouped path always has exactly
``tokens * k`` rows (a static shape), only the per-expert group sizes vary (0 .. tokens), so any routing,
including all tokens on one expert, runs in the same compiled program and nothing is dropped or padded.

Implementations (same result; ``impl``):
- ``"ragged"``: flatten the [tokens, k] choices, stable argsort by expert (ties keep (token, slot) order),
  gather the rows, ``jax.lax.ragged_dot`` with the per-expert group sizes for gate, up and down, gather back
  through the inverse permutation and combine with the routing weights. On GPU/TPU ragged_dot is a grouped
  matmul (XLA's ragged-dot instruction); on CPU jax lowers it to a masked dense dot over every group, so
  there it costs ``tokens * k * experts`` row-matmuls (see benchmarks/moe_step.py).
- ``"gather"``: gather each row's expert weights ([tokens * k, hidden, intermediate]) and run batched
  matvecs: reads only the active experts, which pays for decode (tokens * k <= experts) on CPU.
- ``dense_moe_reference``: every expert on every token with a dense [tokens, experts] routing matrix
  (zeros off the top k). Test reference only.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

MOE_IMPLS = ("ragged", "gather")
Params = dict[str, Any]


def route(
    x: jax.Array, router_kernel: jax.Array, top_k: int, dtype: jnp.dtype = jnp.float32
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[T, H] -> (weights [T, k] float32, experts [T, k] int32, logits [T, E] float32); see module docstring."""
    logits = jnp.dot(x.astype(dtype), router_kernel.astype(dtype)).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    top_p, experts = jax.lax.top_k(probs, top_k)  # equal values: lower index first
    weights = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32), logits


def sort_by_expert(experts: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Flattened [T*k] choices -> (order, inverse order, group_sizes [E] int32); order is a stable argsort."""
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=jnp.int32))
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return order, inverse, group_sizes


def _combine(rows: jax.Array, weights: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """[T*k, H] expert outputs (token-major) x [T, k] float32 weights -> [T, H] in ``dtype``.

    As transformers: each expert output times its float32 weight, cast to the compute dtype, then summed."""
    t, k = weights.shape
    contrib = (rows.reshape(t, k, -1).astype(jnp.float32) * weights[..., None]).astype(dtype)
    return jnp.sum(contrib.astype(jnp.float32), axis=1).astype(dtype)


def _cast(params: Params, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    return tuple(params[n]["kernel"].astype(dtype) for n in ("gate", "up", "down"))  # type: ignore[return-value]


def experts_ragged(
    x: jax.Array, weights: jax.Array, experts: jax.Array, params: Params, dtype: jnp.dtype = jnp.float32
) -> jax.Array:
    """Grouped (dropless) SwiGLU experts for a given routing: sort rows by expert, ragged_dot, unsort."""
    k = experts.shape[1]
    gate, up, down = _cast(params, dtype)
    order, inverse, group_sizes = sort_by_expert(experts, gate.shape[0])
    rows = x.astype(dtype)[order // k]  # [T*k, H], grouped by expert
    h = jax.nn.silu(jax.lax.ragged_dot(rows, gate, group_sizes)) * jax.lax.ragged_dot(rows, up, group_sizes)
    out = jax.lax.ragged_dot(h, down, group_sizes)  # [T*k, H], expert order
    return _combine(out[inverse], weights, dtype)


def experts_gather(
    x: jax.Array, weights: jax.Array, experts: jax.Array, params: Params, dtype: jnp.dtype = jnp.float32
) -> jax.Array:
    """Per-row gathered expert weights and batched matvecs: reads only the chosen experts (decode)."""
    k = experts.shape[1]
    gate, up, down = _cast(params, dtype)
    flat = experts.reshape(-1)
    rows = jnp.repeat(x.astype(dtype), k, axis=0)  # token-major [T*k, H]
    h = jax.nn.silu(jnp.einsum("nh,nhi->ni", rows, gate[flat])) * jnp.einsum("nh,nhi->ni", rows, up[flat])
    return _combine(jnp.einsum("ni,nih->nh", h, down[flat]), weights, dtype)


def dense_routing(weights: jax.Array, experts: jax.Array, num_experts: int) -> jax.Array:
    """[T, k] choices -> dense [T, E] float32 routing matrix, zero off the top k."""
    onehot = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32)  # [T, k, E]
    return jnp.einsum("tk,tke->te", weights.astype(jnp.float32), onehot)


def dense_moe_reference(
    x: jax.Array, weights: jax.Array, experts: jax.Array, params: Params, dtype: jnp.dtype = jnp.float32
) -> jax.Array:
    """Every expert on every token, weighted by the dense routing matrix (test reference only)."""
    gate, up, down = _cast(params, dtype)
    xd = x.astype(dtype)
    h = jax.nn.silu(jnp.einsum("th,ehi->tei", xd, gate)) * jnp.einsum("th,ehi->tei", xd, up)
    y = jnp.einsum("tei,eih->teh", h, down).astype(jnp.float32)
    return jnp.einsum("te,teh->th", dense_routing(weights, experts, gate.shape[0]), y).astype(dtype)


def moe_block(
    x: jax.Array, params: Params, top_k: int, dtype: jnp.dtype = jnp.float32, impl: str = "ragged"
) -> jax.Array:
    """The sparse MoE feed-forward on [..., H] tokens (pure function over the parameter dict above)."""
    if impl not in MOE_IMPLS:
        raise ValueError(f"unknown MoE implementation {impl!r}; expected one of {MOE_IMPLS}")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    weights, experts, _ = route(x2, params["router"]["kernel"], top_k, dtype)
    fn = experts_ragged if impl == "ragged" else experts_gather
    return fn(x2, weights, experts, params, dtype).reshape(shape[:-1] + (-1,))


class _Kernel(nn.Module):
    """One weight {"kernel": shape} in float32 like nn.Dense's kernels; leading axes (experts) are batch axes."""

    shape: tuple[int, ...]

    @nn.compact
    def __call__(self) -> jax.Array:
        batch = tuple(range(len(self.shape) - 2))
        init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=batch)
        return self.param("kernel", init, self.shape, jnp.float32)


class SparseMoE(nn.Module):
    """Linen form of ``moe_block`` with the parameter names above (drop-in for GatedMLP as "mlp"); sows the
    chosen experts as ``intermediates/.../experts``."""

    num_experts: int
    top_k: int
    intermediate_size: int
    dtype: jnp.dtype = jnp.float32
    impl: str = "ragged"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h, e, i = x.shape[-1], self.num_experts, self.intermediate_size
        shapes = {"router": (h, e), "gate": (e, h, i), "up": (e, h, i), "down": (e, i, h)}
        params = {name: {"kernel": _Kernel(shape, name=name)()} for name, shape in shapes.items()}
        if self.impl not in MOE_IMPLS:
            raise ValueError(f"unknown MoE implementation {self.impl!r}; expected one of {MOE_IMPLS}")
        x2 = x.reshape(-1, h)
        weights, experts, _ = route(x2, params["router"]["kernel"], self.top_k, self.dtype)
        self.sow("intermediates", "experts", experts)  # the chosen experts [T, k] (tests: apply(mutable=...))
        fn = experts_ragged if self.impl == "ragged" else experts_gather
        return fn(x2, weights, experts, params, self.dtype).reshape(x.shape)
