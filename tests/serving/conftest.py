"""Serving fixtures: tiny random models (character tokenizer) and an engine factory that checks pages."""

from __future__ import annotations

import pytest

from specrag_jax.serving.engine import Engine
from specrag_jax.serving.tiny import tiny_text_model


def assert_pages_home(engine: Engine) -> None:
    """No request running: every usable page is free or held by the prefix cache alone."""
    st = engine.stats()
    assert st["running_requests"] == 0 and st["queue_depth"] == 0, st
    assert st["pages_free"] + st["pages_cached"] == st["pages_total"], st


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_text_model("tiny:llama", seed=3, num_pages=96, page_size=4, max_seq_len=256)


@pytest.fixture(scope="session")
def tiny_gemma():
    return tiny_text_model("tiny:gemma3", seed=4, num_pages=96, page_size=4, max_seq_len=256)


@pytest.fixture
def engine(tiny_model):
    eng = Engine(tiny_model.runner, tiny_model.generator.eos_ids, name="test").start()
    yield eng
    eng.stop(drain=False)
    eng.cache.clear()
    assert tiny_model.runner.allocator.num_free == tiny_model.runner.allocator.num_usable
