"""The one folder every on-disk cache lives under: ``$SPECRAG_CACHE_DIR``, else ``~/.cache/specrag_jax``."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SPECRAG_CACHE_DIR"


def cache_root() -> Path:
    """``$SPECRAG_CACHE_DIR`` or ``~/.cache/specrag_jax`` (assembled models, XLA programs, stored exports)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specrag_jax"
