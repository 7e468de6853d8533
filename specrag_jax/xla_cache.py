"""JAX's persistent compilation cache, one folder for every command (ask, eval, generate and serve).

Every program is kept, however quickly it compiled: a new process then only traces and lowers
(``compile_time.py`` reports what that costs)."""

from __future__ import annotations

import os
from pathlib import Path

from specrag_jax.cache_root import cache_root
from specrag_jax.errors import SpecRagError


def default_xla_cache_dir() -> Path:
    """``$SPECRAG_COMPILE_CACHE``, else ``$SPECRAG_CACHE_DIR/xla``, else ``~/.cache/specrag_jax/xla``."""
    if os.environ.get("SPECRAG_COMPILE_CACHE"):
        return Path(os.environ["SPECRAG_COMPILE_CACHE"]).expanduser()
    return cache_root() / "xla"


def enable_xla_cache(path: str | Path | None = None) -> Path:
    """Persist compiled programs under ``path`` (default ``default_xla_cache_dir()``); returns the folder."""
    import jax

    path = Path(path).expanduser() if path is not None else default_xla_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecRagError(f"cannot create the compilation cache directory {path}: {exc}") from None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path
