"""Inference loading of a trained drafter: the adapters merged into the base weights at load.

Merged at load (``merge_lora``), not applied on the fly: inference then runs the unmodified decoder and its
Pallas kernels at the base model's speed, and nothing in ``models/`` knows about adapters. (On the fly is what
training needs: a frozen base and gradients for ``A``/``B`` only.)

An adapter is named by a ``specrag train --out`` folder (its newest checkpoint), an exported adapter folder
(``export.py``: ``adapter.safetensors`` + ``adapter.json``) or the name of a known adapter built into the cache
(``specrag_jax.adapters.KNOWN_ADAPTERS``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax

from specrag_jax.adapters import resolve_adapter
from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.transformer import stack_layers, unstack_layers
from specrag_jax.training.checkpoint import TrainCheckpoints, base_fingerprint, check_base, checkpoint_dir
from specrag_jax.training.export import is_export, read_export
from specrag_jax.training.lora import LoraConfig, merge_lora

__all__ = ["adapter_info", "adapter_transform", "checkpoint_dir", "load_adapter"]


def _read(path: Path, step: int | None) -> tuple[Any, dict]:
    if is_export(path):
        trainable, meta = read_export(path)
        if step is not None and step != meta.get("step"):
            raise SpecRagError(f"adapter {path} holds step {meta.get('step')} only, not step {step}")
        return trainable, meta
    ckpts = TrainCheckpoints(checkpoint_dir(path), read_only=True)
    try:
        return ckpts.restore_trainable(step)
    finally:
        ckpts.close()


def load_adapter(
    path: str | Path, base_name: str, cfg: ModelConfig, params: dict, step: int | None = None
) -> tuple[dict, dict]:
    """(params with the trained adapters merged, or the fully fine-tuned params; the adapter's meta).

    ``path``: a train folder, an exported adapter or a known adapter's name. Refuses (one line, both names) an
    adapter trained on another base model. The result keeps the layout (stacked or per-layer) and dtype of
    ``params``."""
    resolved = resolve_adapter(path)
    trainable, meta = _read(resolved, step)
    check_base(meta, base_name, base_fingerprint(cfg, params), what=f"adapter {path}")
    stacked = "layers" in params
    if meta.get("mode") == "full":
        dtype = jax.tree_util.tree_leaves(params)[0].dtype
        full = jax.tree_util.tree_map(lambda a: jax.numpy.asarray(a, dtype), trainable)
        return (stack_layers(full, cfg.num_layers) if stacked else unstack_layers(full, cfg.num_layers)), meta
    merged = merge_lora(params, trainable, LoraConfig.from_json(meta["lora"]))
    return merged, meta


def adapter_transform(base: str, adapter: str | Path | None) -> Callable[[ModelConfig, dict], dict] | None:
    """``TextModel.load``'s ``transform_params`` merging ``adapter`` (its LoRA adapters, or its fully tuned
    weights) into ``base``; None without an adapter. One trained on another model is refused naming both
    (``--drafter-adapter`` on ask, eval and serve)."""
    if adapter is None:
        return None
    resolve_adapter(adapter)  # an unknown name or a missing folder fails before any model loads
    return lambda cfg, params: load_adapter(adapter, base, cfg, params)[0]


def adapter_info(path: str | Path) -> dict[str, Any]:
    """The adapter's metadata (base model, mode, LoRA config, step) without loading arrays."""
    resolved = resolve_adapter(path)
    if is_export(resolved):
        return read_export(resolved)[1]
    ckpts = TrainCheckpoints(checkpoint_dir(resolved), read_only=True)
    try:
        return ckpts.read_meta()
    finally:
        ckpts.close()
