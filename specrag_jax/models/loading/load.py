"""Public entry point: turn a model name, a .gguf file or a Hugging Face directory into params."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.loading.gguf_header import GGUFFile
from specrag_jax.models.loading.gguf_loader import convert_gguf_file, gguf_config, load_gguf
from specrag_jax.models.loading.hf_loader import hf_plan, load_hf
from specrag_jax.models.loading.hf_streaming import load_hf_streaming
from specrag_jax.models.loading.params import flatten_tree, unflatten
from specrag_jax.models.loading.registry import resolve_model_path
from specrag_jax.models.loading.streaming import ShardingsFn
from specrag_jax.models.loading.weights_cache import DTYPES, load_params_cached


@dataclasses.dataclass(frozen=True)
class LoadInfo:
    """How the last ``load_model_params`` call got its parameters."""

    source: str
    dtype: str
    seconds: float
    from_cache: bool
    cache_entry: str | None = None


_LAST_LOAD: LoadInfo | None = None


def last_load_info() -> LoadInfo | None:
    """Timing and cache use of the most recent ``load_model_params`` call (None before any)."""
    return _LAST_LOAD


def check_dtype(dtype: str) -> jnp.dtype:
    """Validate a dtype string ("float32" or "bfloat16") and return the jnp dtype."""
    if dtype not in DTYPES:
        raise SpecRagError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return jnp.dtype(dtype)


def to_jax_leaf(dtype: str) -> Callable[[np.ndarray], jax.Array]:
    """A leaf converter: float32 numpy -> jax array of ``dtype`` on the default device."""
    target = check_dtype(dtype)

    def convert(x: np.ndarray) -> jax.Array:
        # Wait for each copy: device_put is asynchronous and would otherwise keep every numpy
        # buffer alive until all copies finish.
        return jax.device_put(np.asarray(x).astype(target, copy=False)).block_until_ready()

    return convert


def source_config(name_or_path: str) -> ModelConfig:
    """A model's ``ModelConfig`` from its GGUF header or Hugging Face config alone (no weights are read)."""
    path = resolve_model_path(name_or_path).absolute()
    if path.is_dir():
        return hf_plan(path).cfg
    return gguf_config(GGUFFile(path), path)


def read_source(path: Path, leaf_fn: Callable[[np.ndarray], Any] | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Dispatch on the source kind: a ``.gguf`` file or a Hugging Face directory (host-assembled leaves)."""
    if path.is_dir():
        return load_hf(path, leaf_fn)
    if path.is_file():
        return load_gguf(path, leaf_fn)
    raise SpecRagError(f"model path is neither a .gguf file nor a directory: {path}")


def convert_source(path: Path, dtype: str, shardings: ShardingsFn | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Params of ``dtype`` from a source: Hugging Face directories streamed block by block into ``shardings``
    (``hf_streaming``); GGUF files dequantised a tensor at a time, then put with ``shardings``."""
    if path.is_dir():
        return load_hf_streaming(path, dtype, shardings)
    cfg, params = read_source(path, to_jax_leaf(dtype))
    if shardings is not None:
        flat, targets = flatten_tree(params), flatten_tree(shardings(cfg, params))
        params = unflatten({name: jax.device_put(a, targets[name]).block_until_ready() for name, a in flat.items()})
    return cfg, params


def load_model_params(
    name_or_path: str, dtype: str = "float32", cache: bool = True, shardings: ShardingsFn | None = None
) -> tuple[ModelConfig, dict[str, Any]]:
    """Load ``(ModelConfig, params)`` with params as jax arrays of ``dtype`` (float32 or bfloat16).

    ``name_or_path`` is a registry name (e.g. "gemma3-270m"), a .gguf file or a Hugging Face
    directory. With ``cache`` the converted params are kept in an on-disk cache (see
    ``weights_cache.load_params_cached``; directory from ``$SPECRAG_CACHE_DIR``). ``shardings(cfg, abstract)``
    (e.g. ``Placement.param_shardings``): a Sharding per leaf of the stacked tree; leaves are then created
    directly in it from the cache or a Hugging Face directory, never whole on one device or on the host.
    """
    global _LAST_LOAD
    check_dtype(dtype)
    path = resolve_model_path(name_or_path).absolute()
    start = time.perf_counter()

    def convert() -> tuple[ModelConfig, dict[str, Any]]:
        return convert_source(path, dtype, shardings)

    def build(file: Path) -> ModelConfig:  # a GGUF file is dequantised straight into the new cache entry
        return convert_gguf_file(path, dtype, file)

    if cache:
        cfg, params, result = load_params_cached(
            path, convert, dtype=dtype, shardings=shardings, build=build if path.is_file() else None
        )
        hit, entry = result.hit, (str(result.entry) if result.entry else None)
    else:
        (cfg, params), hit, entry = convert(), False, None
    jax.block_until_ready(params)
    _LAST_LOAD = LoadInfo(str(path), dtype, time.perf_counter() - start, hit, entry)
    return cfg, params
