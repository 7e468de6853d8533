"""Drafter fine-tuning (DESIGN.md 5.3): LoRA or full, optax AdamW, packed length buckets, orbax checkpoints.

Modules: ``data`` (the prompt/target JSON-lines format and its checks), ``batching`` (buckets + packing),
``lora`` (adapters applied on the fly; ``merge_lora`` for inference), ``objective`` (forward on the reference
attention path, target-only cross-entropy), ``step`` (optimizer, jitted donated steps), ``sharding``
(placements), ``checkpoint`` (orbax, base-model fingerprint), ``loop`` (the run), ``cli`` (``specrag train``),
``lora_merge`` (a trained adapter merged into the base weights at load).
Public names are re-exported here lazily, so ``specrag`` starts without importing optax or orbax.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Example": "data",
    "LoadedData": "data",
    "load_examples": "data",
    "build_examples": "data",
    "split_holdout": "data",
    "Batch": "batching",
    "BatchPlan": "batching",
    "BatchStream": "batching",
    "bucket_lengths": "batching",
    "LoraConfig": "lora",
    "init_lora": "lora",
    "lora_applied": "lora",
    "merge_lora": "lora",
    "OptimConfig": "step",
    "TrainState": "step",
    "make_optimizer": "step",
    "make_steps": "step",
    "TrainConfig": "config",
    "TrainCheckpoints": "checkpoint",
    "base_fingerprint": "checkpoint",
    "check_base": "checkpoint",
    "TrainResult": "loop",
    "train": "loop",
    "load_adapter": "lora_merge",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
