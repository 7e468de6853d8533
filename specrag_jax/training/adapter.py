"""Inference loading of a training run: the newest checkpoint's adapters merged into the base weights.

Merged at load (``merge_lora``), not applied on the fly: inference then runs the unmodified decoder and its
Pallas kernels at the base model's speed, and nothing in ``models/`` knows about adapters. (On the fly is what
training needs: a frozen base and gradients for ``A``/``B`` only.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.transformer import stack_layers, unstack_layers
from specrag_jax.training.checkpoint import TrainCheckpoints, base_fingerprint, check_base
from specrag_jax.training.lora import LoraConfig, merge_lora


def checkpoint_dir(path: str | Path) -> Path:
    """``OUT`` (a ``specrag train --out``) or ``OUT/checkpoints`` -> the checkpoints folder."""
    p = Path(path)
    if (p / "checkpoints").is_dir():
        return p / "checkpoints"
    if p.is_dir():
        return p
    raise SpecRagError(f"adapter folder not found: {p}")


def load_adapter(path: str | Path, base_name: str, cfg: ModelConfig, params: dict,
                 step: int | None = None) -> tuple[dict, dict]:
    """(params with the trained adapters merged, or the fully fine-tuned params; the checkpoint's meta).

    Refuses (one line, both names) a run trained on another base model. The result keeps the layout
    (stacked or per-layer) and dtype of ``params``."""
    ckpts = TrainCheckpoints(checkpoint_dir(path), read_only=True)
    try:
        trainable, meta = ckpts.restore_trainable(step)
    finally:
        ckpts.close()
    check_base(meta, base_name, base_fingerprint(cfg, params), what=f"adapter {path}")
    stacked = "layers" in params
    if meta.get("mode") == "full":
        dtype = jax.tree_util.tree_leaves(params)[0].dtype
        full = jax.tree_util.tree_map(lambda a: jax.numpy.asarray(a, dtype), trainable)
        return (stack_layers(full, cfg.num_layers) if stacked else unstack_layers(full, cfg.num_layers)), meta
    merged = merge_lora(params, trainable, LoraConfig.from_json(meta["lora"]))
    return merged, meta


def adapter_transform(base: str, adapter: str | Path | None):
    """``TextModel.load``'s ``transform_params`` merging the run in ``adapter`` (its LoRA adapters, or its fully
    tuned weights) into ``base``; None without an adapter. A run trained on another model is refused naming both
    (``--drafter-adapter`` on ask, eval and serve)."""
    if adapter is None:
        return None
    return lambda cfg, params: load_adapter(adapter, base, cfg, params)[0]


def adapter_info(path: str | Path) -> dict[str, Any]:
    """The newest checkpoint's metadata (base model, mode, LoRA config, step) without loading arrays."""
    ckpts = TrainCheckpoints(checkpoint_dir(path), read_only=True)
    try:
        return ckpts.read_meta()
    finally:
        ckpts.close()
