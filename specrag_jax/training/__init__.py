"""Drafter fine-tuning (DESIGN.md 5.3): LoRA or full, optax AdamW, packed length buckets, orbax checkpoints.

Modules: ``data`` (the prompt/target JSON-lines format and its checks), ``batching`` (buckets + packing),
``lora`` (adapters applied on the fly; ``merge_lora`` for inference), ``objective`` (forward on the dense
reference attention, target-only cross-entropy), ``step`` (optimizer, jitted donated steps), ``sharding``
(placements), ``checkpoint`` (orbax, base-model fingerprint), ``loop`` (the run), ``cli`` (``specrag train``),
``lora_merge`` (a trained adapter merged into the base weights at load).
Public names are re-exported here lazily, so ``specrag`` starts without importing optax or orbax.
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "data": (
        "Example",
        "LoadedData",
        "load_examples",
        "build_examples",
        "split_holdout",
    ),
    "batching": (
        "Batch",
        "BatchPlan",
        "BatchStream",
        "bucket_lengths",
    ),
    "lora": (
        "LoraConfig",
        "init_lora",
        "lora_applied",
        "merge_lora",
    ),
    "step": (
        "OptimConfig",
        "TrainState",
        "make_optimizer",
        "make_steps",
    ),
    "config": ("TrainConfig",),
    "checkpoint": (
        "TrainCheckpoints",
        "base_fingerprint",
        "check_base",
    ),
    "loop": (
        "TrainResult",
        "train",
    ),
    "lora_merge": ("load_adapter",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
