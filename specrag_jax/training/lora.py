"""LoRA adapters on the decoder's projections: applied on the fly in training, merged for inference.

For a target projection ``y = x W`` (``W``: the ``[out, in]`` kernel, transposed) the adapter adds
``(alpha / rank) * (x A) B`` with ``A: [in, rank]`` (random, as in PEFT: uniform in +-1/sqrt(in)) and
``B: [rank, out]`` (zeros, so training starts at the base model). Training applies it *on the fly*: a Flax method
interceptor adds the low-rank term after each targeted ``Linear`` (nothing in ``models/`` changes), the base stays
frozen and only ``A``/``B`` reach the optimizer, and the backward pass costs ``tokens * in * rank`` per projection
instead of a full ``[out, in]`` weight gradient. For inference, ``merge_lora`` folds ``(A B).T`` into the kernels
once (no extra work per token).

Adapter tree (per-layer layout, as the Decoder names its modules)::

    {"layers_0": {"attn": {"q": {"a": [hidden, r], "b": [r, heads*head_dim]}, ...}, "mlp": {"up": ...}}, ...}
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.linear import Linear

TARGET_GROUPS = {"q": "attn", "k": "attn", "v": "attn", "o": "attn", "gate": "mlp", "up": "mlp", "down": "mlp"}
ALL_TARGETS = tuple(TARGET_GROUPS)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank, scale numerator and the projections that get adapters."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ALL_TARGETS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise SpecRagError(f"LoRA rank must be >= 1 (got {self.rank})")
        unknown = [t for t in self.targets if t not in TARGET_GROUPS]
        if unknown or not self.targets:
            raise SpecRagError(
                f"unknown LoRA target {unknown[0] if unknown else '(none)'!r}; choose from {', '.join(ALL_TARGETS)}"
            )

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LoraConfig":
        return cls(int(data["rank"]), float(data["alpha"]), tuple(data["targets"]))


def parse_targets(text: str) -> tuple[str, ...]:
    """``"q,v"`` / ``"attn"`` / ``"mlp"`` / ``"all"`` -> target names (validated by LoraConfig)."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part == "all":
            names += ALL_TARGETS
        elif part in ("attn", "mlp"):
            names += [t for t, g in TARGET_GROUPS.items() if g == part]
        elif part:
            names.append(part)
    return tuple(dict.fromkeys(names))


def _kernel_shape(cfg: ModelConfig, target: str) -> tuple[int, int]:
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    return {
        "q": (h, cfg.num_heads * d),
        "k": (h, cfg.num_kv_heads * d),
        "v": (h, cfg.num_kv_heads * d),
        "o": (cfg.num_heads * d, h),
        "gate": (h, i),
        "up": (h, i),
        "down": (i, h),
    }[target]


def init_lora(cfg: ModelConfig, lora: LoraConfig, key: jax.Array, dtype=jnp.float32) -> dict:
    """Fresh adapters for every layer and target (``B = 0``: the adapted model starts as the base)."""
    tree: dict[str, Any] = {}
    keys = jax.random.split(key, cfg.num_layers * len(lora.targets)).reshape(cfg.num_layers, len(lora.targets), -1)
    for layer in range(cfg.num_layers):
        groups: dict[str, dict] = {}
        for j, target in enumerate(lora.targets):
            n_in, n_out = _kernel_shape(cfg, target)
            bound = 1.0 / n_in**0.5
            a = jax.random.uniform(keys[layer, j], (n_in, lora.rank), dtype, -bound, bound)
            groups.setdefault(TARGET_GROUPS[target], {})[target] = {"a": a, "b": jnp.zeros((lora.rank, n_out), dtype)}
        tree[f"layers_{layer}"] = groups
    return tree


def _adapter_at(adapter: dict, path: Sequence[str]) -> dict | None:
    node: Any = adapter
    for name in path:
        if not isinstance(node, dict) or name not in node:
            return None
        node = node[name]
    return node if isinstance(node, dict) and "a" in node else None


@contextlib.contextmanager
def lora_applied(adapter: dict, scale: float) -> Iterator[None]:
    """Within this context every ``Linear`` projection with an adapter at its module path adds ``scale * (x A) B``."""

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        module = context.module
        if context.method_name != "__call__" or not isinstance(module, Linear):
            return out
        ab = _adapter_at(adapter, module.path)
        if ab is None:
            return out
        x = args[0]
        low = jnp.dot(x, ab["a"].astype(x.dtype))
        return out + (scale * jnp.dot(low, ab["b"].astype(x.dtype))).astype(out.dtype)

    with nn.intercept_methods(interceptor):
        yield


def lora_delta(ab: dict, scale: float) -> jax.Array:
    """The ``[out, in]`` kernel update of one adapter (float32): ``scale * (A B).T``, A ``[in, r]``, B ``[r, out]``."""
    return scale * jnp.dot(ab["b"].astype(jnp.float32).T, ab["a"].astype(jnp.float32).T)


def merge_lora(params: dict, adapter: dict, lora: LoraConfig | float) -> dict:
    """Base params with every adapter folded into its kernel (stacked or per-layer layout; same dtype).

    ``lora``: the LoraConfig the adapter was trained with (or its scale ``alpha / rank``). A stacked kernel is
    updated once for all its adapted layers (one scatter per kernel, not one whole-leaf copy per layer)."""
    scale = lora.scale if isinstance(lora, LoraConfig) else float(lora)
    stacked = "layers" in params
    out = jax.tree_util.tree_map(lambda a: a, params)  # new containers; leaves shared until replaced
    updates: dict[tuple[str, str], list[tuple[int, jax.Array]]] = {}  # stacked: (group, target) -> layer deltas
    for layer_name, groups in adapter.items():
        if not layer_name.startswith("layers_"):
            raise SpecRagError(f"adapter entry {layer_name!r} is not a decoder layer")
        index = int(layer_name.split("_", 1)[1])
        for group, targets in groups.items():
            for target, ab in targets.items():
                try:
                    node = (out["layers"] if stacked else out[layer_name])[group][target]
                except KeyError:
                    raise SpecRagError(
                        f"adapter for {layer_name}/{group}/{target} has no matching base weight; "
                        f"was it trained on another model?"
                    ) from None
                kernel = node["kernel"]
                shape = kernel.shape[1:] if stacked else kernel.shape
                if tuple(shape) != (ab["b"].shape[1], ab["a"].shape[0]):  # kernels are [out, in]
                    raise SpecRagError(
                        f"adapter {layer_name}/{group}/{target} has shape {ab['a'].shape[0]}x"
                        f"{ab['b'].shape[1]}, the base kernel {shape[1]}x{shape[0]}"
                    )
                if stacked and not 0 <= index < kernel.shape[0]:
                    raise SpecRagError(f"adapter entry {layer_name!r} is past the model's {kernel.shape[0]} layers")
                if stacked:
                    updates.setdefault((group, target), []).append((index, lora_delta(ab, scale)))
                else:
                    node["kernel"] = (kernel.astype(jnp.float32) + lora_delta(ab, scale)).astype(kernel.dtype)
    for (group, target), deltas in updates.items():
        node = out["layers"][group][target]
        kernel, rows = node["kernel"], np.array([i for i, _ in deltas])
        merged = kernel[rows].astype(jnp.float32) + jnp.stack([d for _, d in deltas])
        node["kernel"] = kernel.at[rows].set(merged.astype(kernel.dtype))
    return out


def count_params(tree: Any) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(tree)))
