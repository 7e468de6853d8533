"""Training checkpoints with orbax: atomic, resumable, tied to the base model they were trained on.

Layout (``OUT/checkpoints/<step>/``, an orbax ``CheckpointManager`` directory)::

    <step>/trainable/   the LoRA adapters (or, with --full, all parameters), per-layer layout
    <step>/opt_state/   the optax state (AdamW moments, counts)
    <step>/meta/        JSON: format, step, data position, base model name + fingerprint, mode, LoRA config,
                        training settings, loss history

Atomicity is orbax's: a step is written into ``<step>.orbax-checkpoint-tmp-*`` and renamed into place once
complete, so an interrupted save leaves the previous step untouched and is never picked up (leftover temporary
directories are removed when the manager opens). The newest ``max_to_keep`` steps are kept.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig, kernel_in_out
from specrag_jax.models.decoder.transformer import stack_layers

FORMAT = 1
_ITEMS = ("trainable", "opt_state", "meta")
_SAMPLE = 1 << 16  # elements hashed per large leaf (strided)


def base_fingerprint(cfg: ModelConfig, params: Any) -> str:
    """A short hash of the base model's weights: the architecture and, per leaf, path, shape and a strided sample
    rounded to bfloat16 (so the float32 and bfloat16 loads of one model agree; another model differs almost
    everywhere). The rest of the config is left out on purpose: a field the model does not use (e.g. the local
    RoPE base of a model without local layers) changed between converter versions, and an adapter must not be
    refused for it (measured: a cache entry written before that change gave another hash for the same weights)."""
    params = stack_layers(params, cfg.num_layers)  # the same hash for the stacked and per-layer layouts
    h = hashlib.sha256(f"fingerprint-2:{cfg.arch}".encode())
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        # hashed in the [in, out] order kernels had until cache format 3, so shipped adapters keep their base
        values, shape = _in_out_sample(np.asarray(leaf), _swapped(name, cfg))
        h.update(f"{jax.tree_util.keystr(path)}:{shape}".encode())
        h.update(np.ascontiguousarray(values.astype(ml_dtypes.bfloat16)).tobytes())
    return h.hexdigest()[:16]


def _swapped(leaf: str, cfg: ModelConfig) -> bool:
    """Whether ``leaf`` is a dense kernel stored ``[out, in]`` (hashed as ``[in, out]``)."""
    return leaf.endswith("kernel") and not kernel_in_out(leaf, cfg)


def _in_out_sample(a: np.ndarray, swapped: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """The strided sample of ``a`` flattened (its last two axes swapped first when ``swapped``) and that shape,
    without copying the array."""
    if not swapped:
        flat = a.reshape(-1)
        return flat[:: max(1, flat.size // _SAMPLE)], tuple(a.shape)
    shape = (*a.shape[:-2], a.shape[-1], a.shape[-2])
    picks = np.arange(0, a.size, max(1, a.size // _SAMPLE))
    index = np.unravel_index(picks, shape)
    return a[(*index[:-2], index[-1], index[-2])], shape


def checkpoint_dir(path: str | Path) -> Path:
    """``OUT`` (a ``specrag train --out``) or ``OUT/checkpoints`` -> the checkpoints folder."""
    p = Path(path)
    if (p / "checkpoints").is_dir():
        return p / "checkpoints"
    if p.is_dir():
        return p
    raise SpecRagError(f"adapter folder not found: {p}")


def check_base(meta: dict, name: str, fingerprint: str, what: str = "checkpoint") -> None:
    """Refuse a checkpoint (or adapter) made for another base model, naming both."""
    saved_name, saved_fp = meta.get("base_model", "?"), meta.get("base_fingerprint", "?")
    if saved_fp != fingerprint:
        raise SpecRagError(
            f"{what} was trained on base model {saved_name!r} (fingerprint {saved_fp}), not on "
            f"{name!r} (fingerprint {fingerprint}); use the model it was trained on or a new --out"
        )


class TrainCheckpoints:
    """Save / restore train state + JSON metadata under ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path, max_to_keep: int = 2, read_only: bool = False) -> None:
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=not read_only,
            create=not read_only,
            read_only=read_only,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps(read=True))

    def save(self, step: int, trainable: Any, opt_state: Any, meta: dict) -> None:
        """Write one step (blocking); it becomes visible only once complete."""
        meta = {**meta, "format": FORMAT, "step": int(step)}
        args = ocp.args.Composite(
            trainable=ocp.args.StandardSave(trainable),
            opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta),
        )
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def read_meta(self, step: int | None = None) -> dict:
        step = self._require(step)
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out.meta)

    def restore(self, step: int | None, trainable_like: Any, opt_state_like: Any) -> tuple[Any, Any, dict]:
        """(trainable, opt_state, meta) of ``step`` (None: the latest), with the shapes, dtypes and shardings of
        the ``*_like`` trees (arrays or ``jax.ShapeDtypeStruct``)."""
        step = self._require(step)
        args = ocp.args.Composite(
            trainable=ocp.args.StandardRestore(_abstract(trainable_like)),
            opt_state=ocp.args.StandardRestore(_abstract(opt_state_like)),
            meta=ocp.args.JsonRestore(),
        )
        try:
            out = self._manager.restore(step, args=args)
        except (ValueError, KeyError, TypeError) as exc:  # tree or shape mismatch
            raise SpecRagError(
                f"checkpoint {self.directory}/{step} does not match this run's model and settings "
                f"({str(exc).splitlines()[0][:160]})"
            ) from None
        return out.trainable, out.opt_state, dict(out.meta)

    def restore_trainable(self, step: int | None = None) -> tuple[Any, dict]:
        """(trainable tree as saved, meta): what inference needs (no optimizer state, no target tree)."""
        step = self._require(step)
        out = self._manager.restore(
            step, args=ocp.args.Composite(trainable=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
        )
        return out.trainable, dict(out.meta)

    def close(self) -> None:
        self._manager.close()

    def _require(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
        if step is None:
            raise SpecRagError(f"no checkpoint in {self.directory}")
        return step


def _abstract(tree: Any) -> Any:
    def leaf(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

    return jax.tree_util.tree_map(leaf, tree)
