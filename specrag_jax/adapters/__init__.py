"""Drafter adapters shipped with the package, by name (``--drafter-adapter NAME``).

Each is a folder written by ``specrag export-adapter`` (``adapter.safetensors`` + ``adapter.json``, which records
the base model, the training command and data); ``specrag_jax/adapters/README.md`` says how each was built.
This module only resolves names: it imports nothing heavy, so the CLI can check a name before loading models.
"""

from __future__ import annotations

from pathlib import Path

from specrag_jax.errors import SpecRagError

ADAPTERS_DIR = Path(__file__).parent
# name -> folder under specrag_jax/adapters (the base model is recorded in its adapter.json and checked at load)
KNOWN_ADAPTERS: dict[str, str] = {"smollm2-rag-drafter": "smollm2-rag-drafter"}


def resolve_adapter(name_or_path: str | Path) -> Path:
    """A shipped adapter's folder for its name, else ``name_or_path`` itself if it exists (one-line error if not)."""
    key = str(name_or_path)
    if key in KNOWN_ADAPTERS:
        return ADAPTERS_DIR / KNOWN_ADAPTERS[key]
    path = Path(name_or_path)
    if path.exists():
        return path
    known = ", ".join(sorted(KNOWN_ADAPTERS)) or "none"
    raise SpecRagError(f"adapter not found: {key} (neither a folder nor a shipped adapter; shipped: {known})")
