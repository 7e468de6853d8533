"""Drafter adapters the project knows how to build, by name (``--drafter-adapter NAME``).

Adapter weights are not kept in the repository: ``make drafter-adapter`` builds ``smollm2-rag-drafter``
reproducibly (``specrag_jax/adapters/README.md``) into ``<cache>/adapters/<name>`` (``$SPECRAG_CACHE_DIR`` or
``~/.cache/specrag_jax``), an ``export-adapter`` folder whose ``adapter.json`` records the base model, the training
command and data. This module only resolves names: it imports nothing heavy, so the CLI checks a name first.
"""

from __future__ import annotations

from pathlib import Path

from specrag_jax.cache_root import cache_root
from specrag_jax.errors import SpecRagError

# name -> how to build it (the base model is recorded in its adapter.json and checked at load)
KNOWN_ADAPTERS: dict[str, str] = {"smollm2-rag-drafter": "make drafter-adapter"}


def built_adapters_dir() -> Path:
    """Where built adapters live: ``<cache root>/adapters``."""
    return cache_root() / "adapters"


def resolve_adapter(name_or_path: str | Path) -> Path:
    """A known adapter's built folder for its name, else ``name_or_path`` itself if it exists (one-line error)."""
    key = str(name_or_path)
    if key in KNOWN_ADAPTERS:
        built = built_adapters_dir() / key
        if not built.is_dir():
            raise SpecRagError(f"adapter {key} is not built on this machine (no {built}); build it with "
                               f"`{KNOWN_ADAPTERS[key]}` (about an hour on 2 CPU cores)")
        return built
    path = Path(name_or_path)
    if path.exists():
        return path
    known = ", ".join(sorted(KNOWN_ADAPTERS)) or "none"
    raise SpecRagError(f"adapter not found: {key} (neither a folder nor a known adapter; known: {known})")
