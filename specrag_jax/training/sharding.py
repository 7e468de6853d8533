"""Where the train state and batches live: the inference placements (``specrag_jax.parallel``), reused.

- Base / fully fine-tuned parameters: ``Placement.param_shardings`` (the logical axis rules; tensor parallel
  over ``model``). The optimizer state of full fine-tuning follows its parameters.
- LoRA adapters: replicated (a few hundred KB; their rank axis is not a model axis).
- Batches: rows split over the ``batch`` rule's mesh axes (``data``) when they divide, else whole.
Without a placement everything is committed to the first device.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.parallel.placement import Placement, put_global
from specrag_jax.parallel.rules import resolve_spec
from specrag_jax.training.step import TrainState, init_state, shardings_of


def batch_sharding(placement: Placement | None, rows: int) -> Any:
    """Sharding of the ``[rows, L]`` batch arrays."""
    if placement is None:
        return None
    spec = resolve_spec(("batch",), {"batch": rows}, placement.mesh, placement.rules)
    data = placement.mesh.shape.get("data", 1)
    if data > 1 and spec == P():
        raise SpecRagError(f"--batch {rows} rows cannot be split over data={data} devices; use a multiple of {data}")
    return NamedSharding(placement.mesh, spec)


def place_frozen(placement: Placement | None, cfg: ModelConfig, params: Any) -> Any:
    """Commit base parameters (per-layer layout) per the placement's rules, or to the first device."""
    if params is None:
        return {}
    if placement is None:
        return jax.device_put(params, jax.devices()[0])
    return placement.put_params(cfg, params)


def place_trainable(placement: Placement | None, cfg: ModelConfig, trainable: Any, mode: str) -> Any:
    """Full fine-tuning: like the base parameters; LoRA adapters: replicated. Always fresh buffers: the train
    step donates them, and the caller's arrays (the loaded base model) must survive."""
    trainable = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), trainable)
    if placement is None:
        return jax.device_put(trainable, jax.devices()[0])
    if mode == "full":
        return placement.put_params(cfg, trainable)
    return jax.tree_util.tree_map(lambda x: put_global(x, placement.replicated), trainable)


def make_state(
    placement: Placement | None, cfg: ModelConfig, trainable: Any, mode: str, optimizer: optax.GradientTransformation
) -> TrainState:
    """A fresh, placed train state (the optimizer state takes the trainable tree's shardings)."""
    state = init_state(place_trainable(placement, cfg, trainable, mode), optimizer)
    if placement is None:  # commit every leaf (jit leaves the optimizer state uncommitted: a second compile)
        return jax.device_put(state, jax.devices()[0])
    devices = set(placement.devices)

    def on_mesh(x):  # leaves jit left on one device (optimizer counts) become replicated over the mesh
        return x if x.sharding.device_set == devices else put_global(np.asarray(x), placement.replicated)

    return jax.tree_util.tree_map(on_mesh, state)


def state_shardings(state: TrainState) -> TrainState:
    return shardings_of(state)


def commit_like(tree: Any, shardings: Any) -> Any:
    """Put every leaf of ``tree`` with the matching sharding (restored checkpoints, opt-state leaves)."""
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, s), tree, shardings)


def frozen_shardings(frozen: Any) -> Any:
    return shardings_of(frozen) if frozen else {}
