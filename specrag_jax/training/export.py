"""A training run's adapters as one small, self-describing folder: ``adapter.safetensors`` + ``adapter.json``.

A ``specrag train --out`` folder holds orbax checkpoints with the optimizer state (three times the adapter's
size) and the loss history; what inference needs is only the trained tree and what it was trained on. The
export writes the newest (or a chosen) step's trainable tree, cast to ``dtype`` (bfloat16 halves the size; the
adapter is then merged into the base weights at load, in float32), with the checkpoint's metadata (base model and
fingerprint, mode, LoRA config, step, settings) as JSON. It is built in a temporary sibling folder and renamed
into place, so a reader never sees half of one. ``--drafter-adapter`` accepts an export, a train folder or the
name of a known adapter built into the cache (``specrag_jax/adapters``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.param_file import load_tree, save_tree
from specrag_jax.training.checkpoint import TrainCheckpoints, checkpoint_dir

ADAPTER_FILE = "adapter.safetensors"
META_FILE = "adapter.json"
EXPORT_DTYPES = ("float32", "bfloat16")


def is_export(path: str | Path) -> bool:
    """True for a folder written by ``export_adapter`` (it holds ``adapter.json``)."""
    return (Path(path) / META_FILE).is_file()


def export_adapter(
    run_dir: str | Path,
    dest: str | Path,
    dtype: str = "bfloat16",
    step: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the trainable tree of ``run_dir``'s checkpoint ``step`` (None: newest) to ``dest`` (must not exist)."""
    if dtype not in EXPORT_DTYPES:
        raise SpecRagError(f"unsupported adapter dtype {dtype!r}; use one of {', '.join(EXPORT_DTYPES)}")
    dest = Path(dest)
    if dest.exists():
        raise SpecRagError(f"adapter destination already exists: {dest}")
    ckpts = TrainCheckpoints(checkpoint_dir(run_dir), read_only=True)
    try:
        trainable, meta = ckpts.restore_trainable(step)
    finally:
        ckpts.close()
    if meta.get("mode") == "full" and dtype != "float32":
        warnings.warn(
            f"exporting fully fine-tuned weights of {run_dir} as {dtype}: they are rounded; "
            f"pass dtype float32 to keep them exact",
            stacklevel=2,
        )
    target = jax.numpy.dtype(dtype)
    tree = jax.tree_util.tree_map(lambda a: np.asarray(a).astype(target), trainable)
    meta = {k: v for k, v in meta.items() if k != "history"}
    meta.update({"dtype": dtype, "source_run": str(Path(run_dir)), **(extra or {})})
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would make a built or shared adapter unreadable to others
    try:
        save_tree(tmp / ADAPTER_FILE, tree)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def read_export(path: str | Path) -> tuple[dict, dict]:
    """(trainable tree, metadata) of an exported adapter folder."""
    path = Path(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise SpecRagError(f"cannot read {path / META_FILE}: {exc}") from None
    if not (path / ADAPTER_FILE).is_file():
        raise SpecRagError(f"adapter folder {path} has {META_FILE} but no {ADAPTER_FILE}")
    return load_tree(path / ADAPTER_FILE), meta
