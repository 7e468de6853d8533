"""Seeding the prefix cache with K/V computed elsewhere (``Engine.seed_prefixes``): full pages only, the loader
called only when needed, the same scores as a prefill, no page leaked when the pool is full or the K/V missing,
on a started engine (between its steps) and on one driven by its caller."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.requests import Tree
from specrag_jax.models.executor.kv_transfer import runner_read_kv
from specrag_jax.serving.tiny import tiny_text_model
from tests.models.engine.conftest import assert_pages_home

PAGE = 8


def _model():
    return tiny_text_model("tiny:llama", seed=5, num_pages=24, page_size=PAGE, max_seq_len=256)


@pytest.fixture(scope="module")
def models():
    """Two copies of the same weights with pools of their own: the source of K/V and the seeded one."""
    return _model(), _model()


def _tokens(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(n).integers(3, 200, n)]


def _tree(n_prefix: int) -> Tree:
    return Tree([7, 9], [-1, 0], [n_prefix, n_prefix + 1], [0, 1], [11, 13])


def _score(engine: Engine, tokens: list[int]) -> np.ndarray:
    req = engine.submit_score(tokens, _tree(len(tokens)))
    return np.asarray(req.future.result(60) if engine.started else engine.drive(req))


def _prefilled_kv(model, tokens: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k, v) of ``tokens``' full pages, computed by a prefill on ``model``, and the scores of the tree there."""
    eng = Engine(model.runner, model.generator.eos_ids, name="source")
    scores = _score(eng, tokens)
    pages = eng.cache.match(tokens, len(tokens) // PAGE, count=False)
    k, v = runner_read_kv(model.runner, pages, len(pages) * PAGE)
    model.runner.allocator.release(pages)
    eng.cache.clear()
    return np.asarray(k), np.asarray(v), scores


@pytest.mark.parametrize("started", [True, False])
@pytest.mark.parametrize("n", [5, 8, 21, 40])
def test_seeded_pages_score_as_a_prefill_and_are_reused(models, started, n):
    source, seeded = models
    tokens = _tokens(n)
    k, v, want = _prefilled_kv(source, tokens)
    eng = Engine(seeded.runner, seeded.generator.eos_ids, name="seeded")
    if started:
        eng.start()
    try:
        calls = []

        def load():
            calls.append(1)
            return k, v

        assert eng.seed_prefixes([(tokens, load)]) == n // PAGE
        assert len(calls) == (1 if n >= PAGE else 0)  # nothing to seed below one page: not even loaded
        assert eng.seed_prefixes([(tokens, load)]) == 0 and len(calls) == (1 if n >= PAGE else 0)  # cached: no load
        hit0 = eng.cache.hit_tokens
        np.testing.assert_allclose(_score(eng, tokens), want, atol=1e-4)
        assert eng.cache.hit_tokens - hit0 == n // PAGE * PAGE  # the seeded pages served the prefix
        assert_pages_home(eng)
    finally:
        eng.stop(drain=False)
        eng.cache.clear()
    alloc = seeded.runner.allocator
    assert alloc.num_free == alloc.num_usable


def test_a_seed_that_does_not_fit_or_has_no_kv_is_skipped(models):
    source, seeded = models
    tokens = _tokens(40)
    k, v, _ = _prefilled_kv(source, tokens)
    eng = Engine(seeded.runner, seeded.generator.eos_ids, name="seeded").start()
    alloc = seeded.runner.allocator
    try:
        assert eng.seed_prefixes([(tokens, lambda: None)]) == 0  # not in the store
        assert eng.seed_prefixes([(tokens, lambda: (k[:, :8], v[:, :8]))]) == 0  # shorter than its full pages
        held = alloc.allocate(alloc.num_free - 2)  # room for 2 of the 5 pages
        assert eng.seed_prefixes([(tokens, lambda: (k, v))]) == 0
        alloc.release(held)
        assert eng.cache.num_pages == 0 and alloc.num_free == alloc.num_usable
        with pytest.raises(ValueError, match="bad store"):
            eng.seed_prefixes([(tokens, lambda: (_ for _ in ()).throw(ValueError("bad store")))])
        assert eng.seed_prefixes([(tokens, lambda: (k, v))]) == 5  # the loop carried on after the error
    finally:
        eng.stop(drain=False)
        eng.cache.clear()
    assert alloc.num_free == alloc.num_usable


def test_wrong_kv_scores_differently(models):
    """Negative control: the score comparison above can fail (seeded zeros change the scores)."""
    source, seeded = models
    tokens = _tokens(21)
    k, v, want = _prefilled_kv(source, tokens)
    eng = Engine(seeded.runner, seeded.generator.eos_ids, name="seeded")
    try:
        assert eng.seed_prefixes([(tokens, lambda: (np.zeros_like(k), np.zeros_like(v)))]) == 2
        assert not np.allclose(_score(eng, tokens), want, atol=1e-4)
    finally:
        eng.cache.clear()
