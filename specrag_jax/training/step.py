"""Train state, optimizer and the jitted train / eval steps (donated state, explicit shardings).

Optimizer: AdamW (``weight_decay`` on matrices only) after global-norm clipping, learning rate from a linear
warm-up to ``lr`` then cosine decay to ``lr * final_lr_ratio`` at ``steps``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.training.objective import batch_nll

BATCH_FIELDS = ("tokens", "labels", "mask", "segments", "positions")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Hyperparameters of the optimizer and its schedule."""

    lr: float = 2e-4
    warmup: int = 20
    steps: int = 200
    clip: float = 1.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    final_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise SpecRagError(f"--steps must be >= 1 (got {self.steps})")
        if not 0 <= self.warmup <= self.steps:
            raise SpecRagError(f"--warmup must be in [0, steps={self.steps}] (got {self.warmup})")
        if not self.lr > 0:
            raise SpecRagError(f"--lr must be > 0 (got {self.lr})")
        if not self.clip > 0:
            raise SpecRagError(f"gradient clip norm must be > 0 (got {self.clip})")


def lr_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Linear warm-up from 0 to ``lr`` over ``warmup`` steps, cosine decay to ``lr * final_lr_ratio``."""
    return optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, cfg.warmup, max(cfg.steps, cfg.warmup + 1), end_value=cfg.lr * cfg.final_lr_ratio
    )


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    decay_mask = functools.partial(jax.tree_util.tree_map, lambda x: x.ndim >= 2)
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip),
        optax.adamw(lr_schedule(cfg), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a step updates: the step counter, the trained tree and the optimizer state."""

    step: jax.Array
    trainable: Any
    opt_state: Any


def init_state(trainable: Any, optimizer: optax.GradientTransformation) -> TrainState:
    """A fresh state; the optimizer state is built under jit so it takes the trainable tree's shardings."""
    opt_state = jax.jit(optimizer.init)(trainable)
    step = jax.device_put(jnp.zeros((), jnp.int32), _sharding_of(trainable))
    return TrainState(step, trainable, opt_state)


def _sharding_of(tree: Any):
    """A replicated sharding over the devices of the tree's first leaf."""
    leaf = jax.tree_util.tree_leaves(tree)[0]
    sharding = leaf.sharding
    if hasattr(sharding, "mesh"):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return sharding


@dataclasses.dataclass(frozen=True)
class StepFns:
    """The jitted train and eval steps of one run (``train(state, frozen, batch)``, ``eval(trainable, ...)``)."""

    train: Callable
    eval: Callable

    def compiled_programs(self) -> int:
        """Programs compiled so far (one per bucket length and step kind)."""
        return int(self.train._cache_size() + self.eval._cache_size())


def make_steps(
    model_cfg: ModelConfig,
    optimizer: optax.GradientTransformation,
    *,
    mode: str,
    lora_scale: float,
    max_segments: int,
    dtype: str = "float32",
    state_shardings: Any = None,
    frozen_shardings: Any = None,
    batch_sharding: Any = None,
    schedule: optax.Schedule | None = None,
) -> StepFns:
    """Jitted steps; with shardings given they are compiled with explicit in/out shardings (data parallel
    over the batch rows, parameters as placed), so the donated state keeps its layout from step to step."""
    nll = functools.partial(
        batch_nll, cfg=model_cfg, mode=mode, lora_scale=lora_scale, max_segments=max_segments, dtype=jnp.dtype(dtype)
    )

    def loss_fn(trainable, frozen, batch):
        total, count = nll(trainable, frozen, batch=batch)
        return total / jnp.maximum(count, 1.0), count

    def train_step(state: TrainState, frozen: Any, batch: dict) -> tuple[TrainState, dict]:
        (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.trainable, frozen, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.trainable)
        trainable = optax.apply_updates(state.trainable, updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "targets": count,
            "lr": schedule(state.step) if schedule is not None else jnp.zeros((), jnp.float32),
        }
        return TrainState(state.step + 1, trainable, opt_state), metrics

    def eval_step(trainable: Any, frozen: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        return nll(trainable, frozen, batch=batch)

    if state_shardings is None:
        return StepFns(jax.jit(train_step, donate_argnums=0), jax.jit(eval_step))
    batch_sh = {k: batch_sharding for k in BATCH_FIELDS}
    replicated = state_shardings.step  # a scalar: replicated over the mesh
    train = jax.jit(
        train_step,
        donate_argnums=0,
        in_shardings=(state_shardings, frozen_shardings, batch_sh),
        out_shardings=(state_shardings, replicated),
    )
    evaluate = jax.jit(
        eval_step,
        in_shardings=(state_shardings.trainable, frozen_shardings, batch_sh),
        out_shardings=(replicated, replicated),
    )
    return StepFns(train, evaluate)


def shardings_of(tree: Any) -> Any:
    """The sharding of every leaf (None leaves stay None)."""
    return jax.tree_util.tree_map(lambda x: x.sharding, tree)
