"""Write a synthetic Hugging Face checkpoint (config.json + safetensors shards + index) of any supported family.

Tensor names and shapes follow ``hf_loader``'s tables for the config's family; values are seeded random.
Shards are written one at a time (``safetensors.numpy.save_file``), so writing holds at most one shard.
Used by ``benchmarks/load_memory.py`` and the streaming-load tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from specrag_jax.models.config import kernel_in_out, param_shapes
from specrag_jax.models.loading.hf_config import hf_config_to_model_config
from specrag_jax.models.loading.hf_loader import HF_NAMES, MIXTRAL_FUSED
from specrag_jax.models.loading.params import flatten_shapes

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def llama_config(**overrides: Any) -> dict[str, Any]:
    """A Llama ``config.json`` dict (small defaults; override sizes to make big tensors)."""
    return {
        "model_type": "llama",
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e4,
        "tie_word_embeddings": False,
        **overrides,
    }


def hf_tensors(raw: dict[str, Any], fused_experts: bool = False) -> Iterator[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every tensor a checkpoint of config ``raw`` holds, in a natural order."""
    cfg = hf_config_to_model_config(raw)
    table = dict(HF_NAMES[cfg.arch], **(MIXTRAL_FUSED if fused_experts else {}))
    if not cfg.tie_embeddings:
        table["lm_head/kernel"] = "lm_head.weight"
    seen: set[str] = set()
    for leaf, shape in flatten_shapes(param_shapes(cfg)).items():
        template = table[leaf] if leaf.startswith("lm_head") else "model." + table[leaf]
        kernel = kernel_in_out(leaf, cfg)  # MoE kernels are [in, out] here, [out, in] on disk
        for i in range(cfg.num_layers) if "{i}" in template else [None]:
            own = shape[1:] if i is not None else shape
            experts = range(cfg.num_experts) if "{j}" in template else [None]
            for j in experts:
                per = own[1:] if j is not None else own
                hf = (*per[:-2], per[-1], per[-2]) if kernel else per
                name, _, half = template.format(i=i, j=j).partition("#")
                if half:  # fused gate_up_proj [E, 2I, H]: written once
                    hf = (hf[0], 2 * hf[1], hf[2])
                if name not in seen:
                    seen.add(name)
                    yield name, tuple(hf)


def write_checkpoint(
    directory: str | Path,
    raw: dict[str, Any],
    dtype: str = "float32",
    seed: int = 0,
    shard_bytes: int = 1 << 62,
    fused_experts: bool = False,
    extra: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Write ``raw`` as config.json and its tensors in shards of about ``shard_bytes`` (an index when more than
    one); ``extra`` tensors are appended. Returns sizes: ``bytes`` (all files), ``largest_tensor_bytes``,
    ``shards``, ``tensors``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw))
    rng, np_dtype = np.random.default_rng(seed), DTYPES[dtype]
    shards: list[dict[str, np.ndarray]] = [{}]
    names: dict[str, int] = {}
    files: list[Path] = []
    largest, pending = 0, 0

    def flush() -> None:
        files.append(directory / f"part-{len(files):05d}.safetensors")
        save_file(shards[-1], str(files[-1]))
        shards[-1] = {}

    items = [(name, shape, None) for name, shape in hf_tensors(raw, fused_experts)]
    items += [(name, value.shape, value) for name, value in (extra or {}).items()]
    for name, shape, value in items:
        if value is None:
            value = (rng.random(shape, dtype=np.float32) - np.float32(0.5)).astype(np_dtype, copy=False)
        if pending and pending + value.nbytes > shard_bytes:
            flush()
            pending = 0
        shards[-1][name] = value
        names[name] = len(files)
        pending += value.nbytes
        largest = max(largest, value.nbytes)
    flush()
    if len(files) > 1:
        weight_map = {name: files[k].name for name, k in names.items()}
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        files[0].rename(directory / "model.safetensors")
        files = [directory / "model.safetensors"]
    total = sum(p.stat().st_size for p in files)
    return {"bytes": total, "largest_tensor_bytes": largest, "shards": len(files), "tensors": len(names)}
