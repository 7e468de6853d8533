"""Drafter adapters shipped with the package, by name (``--drafter-adapter NAME``), and the default per drafter.

Each is a folder written by ``specrag export-adapter`` (``adapter.safetensors`` + ``adapter.json``, which records
the base model, the training command and data); ``specrag_jax/adapters/README.md`` says how each was built and
``make drafter-adapter`` rebuilds it. The project's own trained adapters are tracked; third-party weights never
are. This module only resolves names: it imports nothing heavy, so the CLI checks a name before loading models.
"""

from __future__ import annotations

from pathlib import Path

from specrag_jax.errors import SpecRagError

ADAPTERS_DIR = Path(__file__).parent
# name -> folder under specrag_jax/adapters (the base model is recorded in its adapter.json and checked at load)
KNOWN_ADAPTERS: dict[str, str] = {
    "smollm2-rag-drafter": "smollm2-rag-drafter",
    "smollm2-rag-drafter-fit": "smollm2-rag-drafter-fit",  # train-fit only: not the default (README.md says why)
    # train-fit + synthetic questions, grounded examples only (drafter_data/drafter_records/): not the default yet
    "smollm2-rag-drafter-synth": "smollm2-rag-drafter-synth",
}
# drafter model name -> the adapter applied when --drafter-adapter is not given ("none" turns it off)
DEFAULT_ADAPTERS: dict[str, str] = {"smollm2-135m-instruct": "smollm2-rag-drafter"}
NO_ADAPTER = "none"


def default_adapter(drafter: str, requested: str | None) -> str | None:
    """The adapter a drafter gets: ``requested`` if given (``"none"`` -> None), else the drafter's default."""
    if requested is None:
        return DEFAULT_ADAPTERS.get(drafter)
    return None if requested == NO_ADAPTER else requested


def resolve_adapter(name_or_path: str | Path) -> Path:
    """A shipped adapter's folder for its name, else ``name_or_path`` itself if it exists (one-line error if not)."""
    key = str(name_or_path)
    if key in KNOWN_ADAPTERS:
        folder = ADAPTERS_DIR / KNOWN_ADAPTERS[key]
        if not (folder / "adapter.safetensors").is_file():
            raise SpecRagError(
                f"shipped adapter {key} is missing its weights ({folder}); reinstall the package or "
                f"rebuild it with `make drafter-adapter`"
            )
        return folder
    path = Path(name_or_path)
    if path.exists():
        return path
    known = ", ".join(sorted(KNOWN_ADAPTERS)) or "none"
    raise SpecRagError(
        f"adapter not found: {key} (neither a folder nor a shipped adapter; shipped: {known}, or '{NO_ADAPTER}')"
    )
