"""Engine fixtures: tiny random models (character tokenizer), a started engine that checks its pages."""

from __future__ import annotations

import time

import pytest

from specrag_jax.models.engine.engine import Engine
from specrag_jax.serving.tiny import tiny_text_model

DOCS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "lyon", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine."},
    {"id": "berlin", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"id": "rome", "title": "Rome", "text": "Rome is the capital of Italy."},
]


def assert_pages_home(engine: Engine, wait: float = 10.0) -> None:
    """No request running (waits up to ``wait`` s for cancelled work to be reaped): every usable page is free
    or held by the prefix cache alone."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and (engine.stats()["running_requests"] or engine.stats()["queue_depth"]):
        time.sleep(0.02)
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
