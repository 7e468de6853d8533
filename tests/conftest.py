"""Shared fixtures: transformers' own load of each real GGUF, made once per test session."""

from __future__ import annotations

import gc
from typing import Callable

from tests.xla_env import use_test_flags

use_test_flags()  # before JAX starts its backend

import jax  # noqa: E402
import pytest  # noqa: E402

from specrag_jax.models.engine.warmup import memory_mappings  # noqa: E402

MAP_HEADROOM = 30000  # memory mappings above which the compiled programs are dropped between tests


@pytest.fixture(autouse=True)
def _bounded_memory_mappings():
    """Keep the session under Linux's default vm.max_map_count (65530).

    Every XLA CPU program maps hundreds of memory regions and JAX keeps every program it compiled; late in a
    whole-suite run 57k mappings were in use, and past the limit LLVM fails with "Cannot allocate memory".
    After a test that leaves the count high, drop the compiled programs (they recompile on demand)."""
    yield
    regions = memory_mappings()
    if regions is not None and regions > MAP_HEADROOM:
        jax.clear_caches()
        gc.collect()


@pytest.fixture(scope="session")
def hf_reference() -> Callable[[str], object]:
    """``hf_reference(name)``: the transformers float32 model for a registry name (transformers' GGUF loader, our
    bit-exact dequantiser: ``tests/hf_gguf.py``), cached for the session."""
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            from tests.hf_gguf import transformers_gguf_model

            cache[name] = transformers_gguf_model(name)
        return cache[name]

    return get
