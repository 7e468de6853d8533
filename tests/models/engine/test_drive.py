"""The engine driven on the caller's thread (the offline path) against the same engine on its own thread."""

from __future__ import annotations

import dataclasses

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.requests import RequestTimeout
from specrag_jax.models.generation import Generator, Phase, offline_config
from specrag_jax.models.sampling.params import SamplingParams
from tests.models.engine.conftest import assert_pages_home

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [20 + i for i in range(13)]]


def test_caller_driven_equals_threaded_engine(tiny_model):
    r = tiny_model.runner
    offline = Generator(r, tiny_model.generator.eos_ids)
    threaded = Engine(r, tiny_model.generator.eos_ids, name="threaded", config=offline_config(r)).start()
    try:
        served = Generator.over(threaded)
        for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=5)):
            a = offline.generate(PROMPTS, sampling, max_new_tokens=9)
            b = served.generate(PROMPTS, sampling, max_new_tokens=9)
            assert [x.token_ids for x in a] == [x.token_ids for x in b]
        phases = [Phase(4), Phase(3)]
        a = offline.generate_phases([7, 8, 9, 10, 11], [[1], [2, 3]], phases, lambda p, row, res: (2, [40]))
        b = served.generate_phases([7, 8, 9, 10, 11], [[1], [2, 3]], phases, lambda p, row, res: (2, [40]))
        assert [[x.token_ids for x in ph] for ph in a] == [[x.token_ids for x in ph] for ph in b]
    finally:
        threaded.stop(drain=False)
        threaded.cache.clear()
    assert_pages_home(offline.engine)
    assert r.allocator.num_free == r.allocator.num_usable


def test_a_request_that_cannot_be_admitted_fails_instead_of_waiting(tiny_model):
    r = tiny_model.runner
    held = r.allocator.allocate(r.allocator.num_free - 2)  # pages another owner keeps: admission can never fit
    try:
        with pytest.raises(SpecRagError, match="cannot admit the request"):
            Generator(r).generate([[3] * 30], max_new_tokens=8)
    finally:
        r.allocator.release(held)
    assert Generator(r).generate([[3] * 30], max_new_tokens=8)[0].token_ids
    assert r.allocator.num_free == r.allocator.num_usable


def test_deadline_and_started_engine_rules(tiny_model):
    r = tiny_model.runner
    gen = Generator(r, ctx=RequestContext(timeout=1e-9))
    with pytest.raises(RequestTimeout):
        gen.generate([[3] * 30], max_new_tokens=50)
    assert r.allocator.num_free == r.allocator.num_usable
    eng = Engine(r, name="own-loop").start()
    try:
        req = eng.submit_generate([], [[4, 5]], max_new_tokens=2)
        with pytest.raises(SpecRagError, match="runs its own loop"):
            eng.drive(req)
        req.result(30)
    finally:
        eng.stop(drain=False)
        eng.cache.clear()
    assert r.allocator.num_free == r.allocator.num_usable


@pytest.mark.parametrize("prefill_first", [True, False])
def test_offline_steps_never_mix_decode_rows_into_prefill(tiny_model, prefill_first):
    """Three 20-token prompts under a 32-token budget: [20, 12], [8, 20], then decode. Mixed in, the first
    sequence's decode row would join the second step ([1, 8, 20]); the negative control shows it does."""
    r = tiny_model.runner
    cfg = dataclasses.replace(offline_config(r, 32), prefill_first=prefill_first)
    eng = Engine(r, name="offline", config=cfg, prefix_cache=False)
    steps: list[list[int]] = []
    real_pack = r.pack

    def pack(chunks, **kw):
        steps.append([len(c.tokens) for c in chunks])
        return real_pack(chunks, **kw)

    r.pack = pack
    try:
        Generator.over(eng).generate([[7 + i] * 20 for i in range(3)], max_new_tokens=4)
    finally:
        r.pack = real_pack
    mixed = [s for s in steps if 1 in s and max(s) > 1]
    assert (mixed == []) == prefill_first, steps
    assert r.allocator.num_free == r.allocator.num_usable


@pytest.mark.parametrize("sticky_rows", [True, False])
def test_offline_decode_keeps_its_width_while_branches_finish(tiny_model, sticky_rows):
    """Five branches stopping after 1..5 tokens (the first at its prefill): with sticky rows every decode step has
    the first decode step's four rows (one compiled shape); the negative control shrinks 4, 3, 2, 1."""
    r = tiny_model.runner
    cfg = dataclasses.replace(offline_config(r), sticky_rows=sticky_rows)
    eng = Engine(r, name="offline", config=cfg, prefix_cache=False)
    rows: list[int] = []
    real_pack = r.pack

    def pack(chunks, **kw):
        if all(len(c.tokens) == 1 for c in chunks):
            rows.append(kw["min_seqs"])
        return real_pack(chunks, **kw)

    prompts = [[9 + i, 4, 5] for i in range(5)]
    stop = lambda branch, out: len(out) > branch  # noqa: E731
    r.pack = pack
    try:
        out = Generator.over(eng).generate(prompts, max_new_tokens=8, stop_fn=stop)
        again = Generator.over(eng).generate(prompts[:2], max_new_tokens=3)  # a new batch: its own width
    finally:
        r.pack = real_pack
    assert [len(x.token_ids) for x in out] == [1, 2, 3, 4, 5]
    assert [len(x.token_ids) for x in again] == [3, 3]
    first, second = rows[:4], rows[4:]
    assert first == ([4] * 4 if sticky_rows else [4, 3, 2, 1]), rows
    assert second == [2, 2], rows
    assert r.allocator.num_free == r.allocator.num_usable
