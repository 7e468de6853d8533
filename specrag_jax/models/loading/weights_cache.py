"""An on-disk cache of converted models: one safetensors file per model and dtype, read memory-mapped.

A cache entry is a directory ``<cache_dir>/<stem>-<dtype>-<hash>/`` holding ``params/model.safetensors``
(the parameter tree, see ``param_file``), ``config.json`` (the ``ModelConfig``), ``key.json`` (what the
entry was built from) and ``files.json`` (every file under ``params/`` with its size). Entries are
built in a temporary sibling directory and renamed into place, so a reader never sees half of
one; an entry whose file list, config or arrays do not check out is deleted and rebuilt. (Until
CACHE_FORMAT 2 this was an orbax checkpoint; restoring Qwen2.5-1.5B's 6.2 GB took 27 s that way, 2 s
memory-mapped.) A GGUF source is dequantised straight into a memory map of the new entry's file (``build``),
which is then read back as a hit: the converted tree is never held in memory and written a second time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import jax

from specrag_jax.cache_root import CACHE_ENV, cache_root
from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig, param_shapes
from specrag_jax.models.loading.param_file import load_tree, save_tree
from specrag_jax.models.loading.streaming import ShardingsFn

CACHE_FORMAT = 3  # bump when the conversion changes, so old entries are not reused (3: dense kernels [out, in])
DTYPES = ("float32", "bfloat16")
PARAMS_FILE = "model.safetensors"


def default_cache_dir() -> Path:
    """``$SPECRAG_CACHE_DIR`` or ``~/.cache/specrag_jax/params``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else cache_root() / "params"


def config_to_json(cfg: ModelConfig) -> str:
    return json.dumps(dataclasses.asdict(cfg), indent=1, sort_keys=True)


def config_from_json(text: str) -> ModelConfig:
    data = json.loads(text)  # JSON lists back to tuples (eos_token_ids, layer_types): the config stays hashable
    return ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


class ShardingFailed(SpecRagError):
    """The shardings function failed on a cache hit (e.g. a mesh that does not divide a dimension)."""


def restore_params(
    directory: str | Path, cfg: ModelConfig, dtype: str, shardings: ShardingsFn | None = None
) -> dict[str, Any]:
    """Read the saved tree memory-mapped (into ``shardings(cfg, abstract)`` if given); it must hold exactly
    the shapes and dtype ``cfg`` needs."""
    expected = jax.tree.map(
        lambda shape: (tuple(shape), jax.numpy.dtype(dtype)), param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)
    )

    def per_tree(tree: Any) -> Any:
        try:
            return shardings(cfg, tree)
        except Exception as exc:  # the placement's fault, not the entry's: never a reason to delete it
            raise ShardingFailed(str(exc).splitlines()[0] if str(exc) else repr(exc)) from exc

    return load_tree(Path(directory) / PARAMS_FILE, expected, None if shardings is None else per_tree)


def source_fingerprint(source: Path) -> list[list[Any]]:
    """(relative name, size, mtime_ns) of the source file, or of config/weights in a directory."""
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix in (".json", ".safetensors") and p.is_file())
    else:
        files = [source]
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def cache_key(source: str | Path, dtype: str) -> dict[str, Any]:
    source = Path(source).absolute()
    return {"path": str(source), "files": source_fingerprint(source), "dtype": dtype, "format": CACHE_FORMAT}


def entry_dir(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir / f"{Path(key['path']).stem}-{key['dtype']}-{digest}"


def _file_list(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _read_entry(
    entry: Path, key: dict[str, Any], shardings: ShardingsFn | None = None
) -> tuple[ModelConfig, dict[str, Any]]:
    if json.loads((entry / "key.json").read_text()) != key:
        raise ValueError("key mismatch")
    if _file_list(entry / "params") != json.loads((entry / "files.json").read_text()):
        raise ValueError("file list mismatch")
    cfg = config_from_json((entry / "config.json").read_text())
    return cfg, restore_params(entry / "params", cfg, key["dtype"], shardings)


Builder = Callable[[Path], ModelConfig]  # writes the params file at the given path, returns the model's config


def _write_entry(cache_dir: Path, entry: Path, key: dict[str, Any], build: Builder) -> None:
    """Build an entry in a temporary sibling and rename it into place (a reader never sees half of one)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=cache_dir))
    try:
        (tmp / "params").mkdir()
        cfg = build(tmp / "params" / PARAMS_FILE)
        (tmp / "config.json").write_text(config_to_json(cfg))
        (tmp / "key.json").write_text(json.dumps(key, sort_keys=True))
        (tmp / "files.json").write_text(json.dumps(_file_list(tmp / "params")))
        try:
            os.rename(tmp, entry)
        except OSError:  # another process finished the same entry first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for other in cache_dir.glob(f"{Path(key['path']).stem}-{key['dtype']}-*"):
        if other != entry and _stale_for(other, key):
            shutil.rmtree(other, ignore_errors=True)


def _stale_for(other: Path, key: dict[str, Any]) -> bool:
    """True if ``other`` is an older entry for the same source and dtype."""
    try:
        old = json.loads((other / "key.json").read_text())
    except (OSError, ValueError):
        return False
    return old.get("path") == key["path"] and old.get("dtype") == key["dtype"]


@dataclasses.dataclass(frozen=True)
class CacheResult:
    """What ``load_params_cached`` did: ``hit`` is True when the params came from ``entry``."""

    hit: bool
    entry: Path | None
    rebuilt_corrupt: bool = False


def load_params_cached(
    source_path: str | Path,
    loader: Callable[[], tuple[ModelConfig, dict[str, Any]]],
    cache_dir: str | Path | None = None,
    dtype: str = "float32",
    shardings: ShardingsFn | None = None,
    build: Builder | None = None,
) -> tuple[ModelConfig, dict[str, Any], CacheResult]:
    """Return ``(cfg, params)`` for ``source_path`` from the cache, or call ``loader()`` and cache it.

    ``loader`` must return params as jax arrays already cast to ``dtype``. The cache key is the
    absolute source path, its size and mtime, the dtype and ``CACHE_FORMAT``; an unreadable or
    incomplete entry is removed and rebuilt. Cache write failures never fail the load. ``shardings(cfg,
    abstract)``: a hit is read straight into these shardings, each device reading its part of the file.
    ``build(file)``: on a miss, write the params file directly (e.g. a GGUF dequantised into a memory map of
    it) and read the new entry back like a hit; ``loader`` is then only the fallback if writing fails.
    """
    if dtype not in DTYPES:
        raise SpecRagError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = cache_key(source_path, dtype)
    entry = entry_dir(cache_dir, key)
    corrupt = False
    if entry.is_dir():
        try:
            cfg, params = _read_entry(entry, key, shardings)
            return cfg, params, CacheResult(hit=True, entry=entry)
        except ShardingFailed:
            raise
        except Exception:  # corrupt, partial or from an incompatible version: rebuild it
            corrupt = True
            shutil.rmtree(entry, ignore_errors=True)
    if build is not None:
        try:
            _write_entry(cache_dir, entry, key, build)
            cfg, params = _read_entry(entry, key, shardings)
            return cfg, params, CacheResult(hit=False, entry=entry, rebuilt_corrupt=corrupt)
        except SpecRagError:  # a bad source (or placement): the same error as without a cache
            raise
        except Exception as exc:  # a full disk or read-only cache must not fail the load: convert in memory
            warnings.warn(f"could not write parameter cache {entry}: {exc}", stacklevel=2)
            cfg, params = loader()
            return cfg, params, CacheResult(hit=False, entry=None, rebuilt_corrupt=corrupt)
    cfg, params = loader()
    try:
        _write_entry(cache_dir, entry, key, lambda file: _save(file, cfg, params))
    except Exception as exc:  # a full disk or read-only cache must not fail the load
        warnings.warn(f"could not write parameter cache {entry}: {exc}", stacklevel=2)
    return cfg, params, CacheResult(hit=False, entry=entry if entry.is_dir() else None, rebuilt_corrupt=corrupt)


def _save(file: Path, cfg: ModelConfig, params: dict[str, Any]) -> ModelConfig:
    save_tree(file, params)
    return cfg
