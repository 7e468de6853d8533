"""Logical axis rules: parameter and cache axes (embed, heads, kv_heads, mlp, vocab, ...) -> mesh axes.

Every parameter leaf and the KV pool get logical axis names; a rule table maps each logical axis to
mesh axes. An axis whose logical size does not divide by the mesh axes it maps to is replicated (Gemma 3
270M has one KV head, so its K/V projections and pool stay whole on every device while the query heads,
MLP and vocabulary are split). Axes in ``STRICT_AXES`` must divide: they raise instead.

Mixture of experts (Mixtral): expert weights ``[experts, embed, mlp]`` / ``[experts, mlp, embed]``, router
``[embed, expert_logits]``. Default: tensor parallelism *inside* every expert (``experts`` whole, ``mlp`` over
"model", the router replicated): each device holds 1/n of every expert, so any routing (dropless, static
shapes, all tokens on one expert included) keeps every device equally busy, and a layer costs the one
all-reduce after ``down`` that a dense MLP costs. ``experts="model"`` gives expert parallelism instead (each
device holds whole experts; ``mlp`` then stays whole, since a mesh axis is used once per array): less memory
traffic per device for large batches, but the partitioner exchanges activations to reach the experts, and a
decode step's few tokens use only the devices of their k experts (see benchmarks/collectives.py).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig

MeshAxes = str | tuple[str, ...] | None

# Megatron-style tensor parallelism over "model", data parallelism (packed tokens) over "data".
DEFAULT_RULES: dict[str, MeshAxes] = {
    "batch": "data",  # packed tokens of a step (activations)
    "vocab": "model",  # embedding / LM head rows
    "embed": None,  # hidden size: replicated (the residual stream is whole on every device)
    "heads": "model",  # query heads (and the attention output projection's input)
    "kv_heads": "model",  # K/V heads (projections and the page pool)
    "mlp": "model",  # intermediate size of the gated MLP (and of each expert)
    "experts": None,  # MoE expert axis: whole (tensor parallel inside experts); "model" = expert parallel
    "expert_logits": None,  # router output columns: the router is replicated
    "head_dim": None,
    "layers": None,
    "pages": None,  # page pool: each model-parallel group holds every page (of its heads)
    "page_slot": None,
    "docs": ("data", "model"),  # dense-index rows: spread over every device
}

# Logical axes that must divide when a rule maps them to mesh axes (no silent replication).
STRICT_AXES = frozenset({"pages"})

# Leaf name (the parameter's module) -> logical axes of the per-layer array.
_LEAF_AXES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("vocab", "embed"),  # dense kernels are [out, in]
    "q": ("heads", "embed"),
    "k": ("kv_heads", "embed"),
    "v": ("kv_heads", "embed"),
    "o": ("embed", "heads"),
    "gate": ("mlp", "embed"),
    "up": ("mlp", "embed"),
    "down": ("embed", "mlp"),
    "q_norm": ("head_dim",),
    "k_norm": ("head_dim",),
}

_MOE_AXES: dict[str, tuple[str, ...]] = {
    "router": ("embed", "expert_logits"),
    "gate": ("experts", "embed", "mlp"),
    "up": ("experts", "embed", "mlp"),
    "down": ("experts", "mlp", "embed"),
}

POOL_AXES = ("pages", "page_slot", "kv_heads", "head_dim")


def logical_sizes(cfg: ModelConfig) -> dict[str, int]:
    """The count each logical axis splits (heads count whole heads, not heads * head_dim columns)."""
    return {
        "vocab": cfg.vocab_size,
        "embed": cfg.hidden_size,
        "heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads,
        "mlp": cfg.intermediate_size,
        "head_dim": cfg.head_dim,
        "layers": cfg.num_layers,
        "experts": cfg.num_experts,
        "expert_logits": cfg.num_experts,
    }


def _key(entry: Any) -> str:
    return str(getattr(entry, "key", getattr(entry, "name", entry)))


def leaf_logical_axes(path: tuple, ndim: int, moe: bool = False) -> tuple[str, ...]:
    """Logical axes of one parameter leaf from its tree path (stacked layouts get a leading ``layers``);
    ``moe``: the ``mlp`` block is the sparse MoE one (router + expert-stacked kernels)."""
    keys = [_key(k) for k in path]
    module = keys[-2] if len(keys) >= 2 else keys[-1]
    in_mlp = len(keys) >= 3 and keys[-3] == "mlp"
    axes = (_MOE_AXES if moe and in_mlp else _LEAF_AXES).get(module, ("embed",))  # norms: one hidden-sized scale
    if keys[-1] == "bias":  # a projection's bias follows its kernel's output axis ([out, in]; MoE: [in, out])
        axes = axes[-1:] if moe and in_mlp else axes[:1]
    if ndim == len(axes) + 1:
        axes = ("layers",) + axes
    if ndim != len(axes):
        raise SpecRagError(f"parameter {'/'.join(keys)} has {ndim} dims; expected logical axes {axes}")
    return axes


def resolve_spec(
    axes: tuple[str, ...],
    sizes: Mapping[str, int],
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    replicated: list[str] | None = None,
    what: str = "array",
) -> P:
    """PartitionSpec for an array with the given logical axes.

    A logical axis is split over its rule's mesh axes (those present in ``mesh`` and not already used by
    an earlier dimension) when its size divides; otherwise it is replicated and noted in ``replicated``,
    or, for ``STRICT_AXES``, a SpecRagError names the dimension and the mesh axis.
    """
    used: set[str] = set()
    out: list[MeshAxes] = []
    for name in axes:
        rule = rules.get(name)
        mesh_axes = [a for a in ((rule,) if isinstance(rule, str) else (rule or ())) if a in mesh.shape]
        mesh_axes = [a for a in mesh_axes if a not in used and mesh.shape[a] > 1]
        n = math.prod(mesh.shape[a] for a in mesh_axes)
        size = sizes.get(name)
        if not mesh_axes:
            out.append(None)
            continue
        if size is None or size % n:
            split = ",".join(f"{a}={mesh.shape[a]}" for a in mesh_axes)
            if name in STRICT_AXES:
                raise SpecRagError(
                    f"{what}: {name} dimension of size {size} cannot be divided over mesh "
                    f"axes {split}; choose a size that is a multiple of {n}"
                )
            if replicated is not None:
                replicated.append(f"{what}:{name}({size} over {split})")
            out.append(None)
            continue
        used.update(mesh_axes)
        out.append(mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes))
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def param_specs(
    cfg: ModelConfig,
    params: Any,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    replicated: list[str] | None = None,
) -> Any:
    """A PartitionSpec per parameter leaf (stacked or per-layer layout, either architecture)."""
    sizes = logical_sizes(cfg)

    def spec(path, leaf):
        axes = leaf_logical_axes(path, len(leaf.shape), moe=cfg.num_experts > 0)
        name = "/".join(_key(k) for k in path)
        return resolve_spec(axes, sizes, mesh, rules, replicated, what=name)

    return jax.tree_util.tree_map_with_path(spec, params)


def pool_spec(
    cfg: ModelConfig,
    num_pages: int,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    replicated: list[str] | None = None,
) -> P:
    """PartitionSpec of one layer's K (or V) page pool ``[num_pages, page_size, Hkv, D]``."""
    sizes = {"pages": num_pages, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim}
    return resolve_spec(POOL_AXES, sizes, mesh, rules, replicated, what="kv_pool")
