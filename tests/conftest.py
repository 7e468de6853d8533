"""Shared fixtures: transformers' own load of each real GGUF, made once per test session."""

from __future__ import annotations

import gc
from typing import Callable

from tests.xla_env import use_test_flags

use_test_flags()  # before JAX starts its backend

import jax  # noqa: E402
import pytest  # noqa: E402

from specrag_jax.host_memory import release_free_heap  # noqa: E402
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


@pytest.fixture(autouse=True, scope="module")
def _free_heap_back_to_the_os():
    """After each test file, hand the malloc arenas' free pages back to the OS (``host_memory``).

    The two workers of ``-n 2`` share the machine's memory, and each kept every page it ever freed: in a
    whole-suite run one worker held 9 GB of anonymous memory between its real-model files, most of it free heap
    (one file alone: 2.3 GB -> 0.4 GB after the release), and with the other worker loading Qwen the machine's
    23.5 GB ran out."""
    yield
    gc.collect()
    release_free_heap()


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
