"""Shared fixtures: transformers' own load of each real GGUF, made once per test session."""

from __future__ import annotations

from typing import Callable

import pytest


@pytest.fixture(scope="session")
def hf_reference() -> Callable[[str], object]:
    """``hf_reference(name)``: the transformers float32 model for a registry name, cached for the session."""
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            import torch
            from transformers import AutoModelForCausalLM

            from specrag_jax.models.registry import resolve_model_path

            torch.set_num_threads(2)
            path = resolve_model_path(name)
            cache[name] = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32
            ).eval()
        return cache[name]

    return get
