"""Sharded train step == single-device train step, on a tiny model (run with 8 host devices).

``XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m specrag_jax.training.sharded_check`` prints one
JSON object: per mode (lora, full), the losses of a few steps on one device and on a ``data=4,model=2`` mesh
(batch rows over ``data``, parameters per the logical rules), the largest parameter difference after them, and
where the batch and a few parameters live.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params, unstack_layers
from specrag_jax.parallel.placement import Placement
from specrag_jax.training import sharding as sh
from specrag_jax.training.batching import BatchPlan, bucket_lengths
from specrag_jax.training.config import TrainConfig
from specrag_jax.training.data import Example
from specrag_jax.training.lora import LoraConfig, init_lora
from specrag_jax.training.step import BATCH_FIELDS, OptimConfig, make_optimizer, make_steps


def _examples(n: int, seed: int) -> list[Example]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(3, 90, int(rng.integers(4, 20))).astype(np.int32)
        start = int(rng.integers(3, 80))
        out.append(Example(prompt, np.arange(start, start + int(rng.integers(2, 9)), dtype=np.int32)))
    return out


def run_steps(mode: str, placement: Placement | None, steps: int = 4) -> tuple[list[float], Any, dict]:
    """Losses of ``steps`` train steps and the final trainable tree (as numpy)."""
    cfg = tiny_config("llama")
    params = unstack_layers(init_params(cfg, seed=3), cfg.num_layers)
    config = TrainConfig(
        mode=mode, lora=LoraConfig(4, 8.0), optim=OptimConfig(lr=1e-2, warmup=1, steps=steps), batch=8, max_len=64
    )
    trainable = init_lora(cfg, config.lora, jax.random.PRNGKey(0)) if mode == "lora" else params
    frozen = params if mode == "lora" else None
    optimizer = make_optimizer(config.optim)
    state = sh.make_state(placement, cfg, trainable, mode, optimizer)
    frozen = sh.place_frozen(placement, cfg, frozen)
    batch_sharding = sh.batch_sharding(placement, config.batch)
    fns = make_steps(
        cfg,
        optimizer,
        mode=mode,
        lora_scale=config.lora_scale,
        max_segments=config.max_segments,
        state_shardings=sh.state_shardings(state) if placement else None,
        frozen_shardings=sh.frozen_shardings(frozen),
        batch_sharding=batch_sharding,
    )
    plan = BatchPlan(config.batch, bucket_lengths(config.max_len), config.max_segments)
    batches = plan.batches(_examples(120, 1), seed=0)
    assert len(batches) >= steps
    losses = []
    for b in batches[:steps]:
        arrays = {k: getattr(b, k) for k in BATCH_FIELDS}
        arrays = {k: jax.device_put(v, batch_sharding or jax.devices()[0]) for k, v in arrays.items()}
        state, metrics = fns.train(state, frozen, arrays)
        losses.append(float(metrics["loss"]))
    info = {"programs": fns.train._cache_size(), "batch_sharding": str(getattr(batch_sharding, "spec", None))}
    if placement is not None:
        leaf = state.trainable["layers_0"]["mlp"]["up"]["a" if mode == "lora" else "kernel"]
        info["trainable_up"] = str(leaf.sharding.spec)
        base = (frozen if mode == "lora" else state.trainable)["layers_0"]["mlp"]["up"]["kernel"]
        info["base_up_kernel"] = str(base.sharding.spec)
        info["devices"] = len(base.sharding.device_set)
    return losses, jax.tree_util.tree_map(np.asarray, state.trainable), info


def check(mode: str) -> dict:
    single, single_tree, _ = run_steps(mode, None)
    placement = Placement.from_spec("data=4,model=2")
    sharded, sharded_tree, info = run_steps(mode, placement)
    diffs = jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(lambda a, b: float(np.abs(a - b).max()), single_tree, sharded_tree)
    )
    return {
        "mode": mode,
        "single": single,
        "sharded": sharded,
        "max_param_diff": max(diffs),
        "max_loss_diff": max(abs(a - b) for a, b in zip(single, sharded)),
        **info,
    }


def main() -> None:
    print(json.dumps({"devices": len(jax.devices()), "checks": [check("lora"), check("full")]}))


if __name__ == "__main__":
    main()
