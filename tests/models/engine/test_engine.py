"""Engine: batch invariance, shared-prefix groups, tree scoring, the prefix cache and page accounting."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.policy import Backpressure, SchedulerConfig
from specrag_jax.models.engine.requests import (
    EngineError,
    EngineStopped,
    QueueFull,
    RequestCancelled,
    RequestTimeout,
    Tree,
)
from specrag_jax.models.generation import Generator, greedy_generate
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.serving.tiny import tiny_text_model
from tests.models.engine.conftest import assert_pages_home

PROMPTS = [[5 + (i * 7 + j) % 60 for j in range(3 + 5 * i)] for i in range(8)]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_greedy_output_alone_equals_under_8_concurrent_requests(arch, tiny_model, tiny_gemma):
    tiny_model = tiny_model if arch == "llama" else tiny_gemma
    engine = Engine(tiny_model.runner, tiny_model.generator.eos_ids, name=arch).start()
    try:
        _invariance(engine, tiny_model)
    finally:
        engine.stop(drain=False)
        engine.cache.clear()


def _invariance(engine, tiny_model):
    want = greedy_generate(tiny_model.runner, PROMPTS, 10, tiny_model.generator.eos_ids)  # before the cache holds pages
    alone = [engine.submit_generate([], [p], max_new_tokens=10).result(60)[0].token_ids for p in PROMPTS]
    assert alone == want
    reqs = [engine.submit_generate([], [p], max_new_tokens=10) for p in PROMPTS]
    assert [r.result(60)[0].token_ids for r in reqs] == alone
    sampled = SamplingParams(temperature=0.8, top_k=20, seed=5)
    one = engine.submit_generate([], [PROMPTS[3]], sampled, 8).result(60)[0].token_ids
    many = [engine.submit_generate([], [p], sampled, 8) for p in PROMPTS]
    assert many[3].result(60)[0].token_ids == one
    for r in many:
        r.result(60)
    assert_pages_home(engine)


def test_branch_group_equals_generator_and_tree_scores_match(engine, tiny_model):
    prefix = list(range(10, 31))
    suffixes = [[40, 41], [42], [43, 44, 45]]
    ref = Generator(tiny_model.runner, tiny_model.generator.eos_ids).generate_branches(
        prefix, suffixes, max_new_tokens=6
    )
    tokens, parents, positions = [50, 51, 52, 53], [-1, 0, -1, 2], [21, 22, 21, 22]
    rows, targets = [0, 1, 2, 3], [51, 60, 53, 61]
    want = Generator(tiny_model.runner).score_tree(prefix, tokens, parents, positions, rows, targets)
    longer = [s + list(range(60, 70)) for s in suffixes]  # like drafting's 2nd phase: 1st-phase prompts + more
    ref2 = Generator(tiny_model.runner, tiny_model.generator.eos_ids).generate_branches(
        prefix, longer, max_new_tokens=6
    )
    got = engine.submit_generate(prefix, suffixes, max_new_tokens=6).result(60)
    assert [g.token_ids for g in got] == [r.token_ids for r in ref]
    assert got[0].shared_prefix_tokens == 20
    before = engine.stats()["prefill_tokens"]
    got2 = engine.submit_generate(prefix, longer, max_new_tokens=6).result(60)
    assert [g.token_ids for g in got2] == [r.token_ids for r in ref2]
    # each branch starts from its cached 1st-phase pages: only the last partial page + the new tokens prefill
    assert engine.stats()["prefill_tokens"] - before < sum(len(s) for s in longer)
    got = engine.submit_score(prefix, Tree(tokens, parents, positions, rows, targets)).result(60)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert_pages_home(engine)


@pytest.mark.parametrize("budget", [64, 16])
def test_offline_tree_scores_with_its_prefix_in_one_step(tiny_model, budget):
    """Without a prefix cache the tree's prefix is scored inside the tree's step (one step, no pages), equal to a
    caching engine's prefill-then-score; a prefix + tree over the token budget keeps the two steps."""
    prefix = list(range(10, 31))  # 21 tokens: 5 full pages of 4 + 1
    tokens, parents, positions = [50, 51, 52, 53, 54], [-1, 0, -1, 2, 1], [21, 22, 21, 22, 23]
    rows, targets = [0, 1, 2, 3, 4, 1], [51, 60, 53, 61, 7, 54]
    cached = Generator(tiny_model.runner, max_prefill_tokens=budget, prefix_cache=True)
    offline = Generator(tiny_model.runner, max_prefill_tokens=budget)
    want = cached.score_tree(prefix, tokens, parents, positions, rows, targets)
    before = offline.engine.stats().get("steps", 0)
    got = offline.score_tree(prefix, tokens, parents, positions, rows, targets)
    np.testing.assert_allclose(got, want, atol=1e-5)
    folded = len(prefix) + len(tokens) <= budget
    prefill_steps = 0 if folded else -(-len(prefix) // budget)
    assert offline.engine.stats()["steps"] - before == 1 + prefill_steps
    assert cached.engine.stats()["steps"] >= 2  # the caching engine prefilled the prefix first
    counts: dict = {}
    again = cached.score_tree(prefix, tokens, parents, positions, rows, targets, counts)
    assert counts["cached_tokens"] == 20 and np.allclose(again, want, atol=1e-5)  # its 5 full pages served
    offline.score_tree(prefix, tokens, parents, positions, rows, targets, counts)
    assert counts["cached_tokens"] == 0
    cached.engine.cache.clear()
    assert_pages_home(cached.engine)
    assert_pages_home(offline.engine)


def test_prefix_cache_hits_on_repeated_question(engine):
    question = list(range(5, 69))  # 64 tokens = 16 pages of 4
    first = engine.submit_generate([], [question + [70]], max_new_tokens=4).result(60)
    prefill_before = engine.stats()["prefill_tokens"]
    for i in range(4):
        again = engine.submit_generate([], [question + [71 + i]], max_new_tokens=4).result(60)
    st = engine.stats()
    assert st["prefix_hit_tokens"] == 4 * 64  # every repeat reuses the question's 16 pages
    assert st["prefill_tokens"] - prefill_before == 4 * 1  # only the new last token is prefilled
    assert st["prefix_hit_rate"] > 0.7
    assert st["pages_cached"] >= 16
    assert first[0].num_prompt_tokens == again[0].num_prompt_tokens == 65
    assert_pages_home(engine)


def test_cache_evicts_lru_to_admit_and_pages_return(tiny_model):
    eng = Engine(tiny_model.runner, name="small", config=SchedulerConfig(token_budget=64)).start()
    try:
        total = eng.stats()["pages_total"]
        for i in range(12):  # each prompt caches ~12 pages: the pool must evict old prefixes to admit new ones
            eng.submit_generate([], [[5 + i] * 50], max_new_tokens=3).result(60)
            assert_pages_home(eng)
        assert eng.cache.evicted_pages > 0 and eng.stats()["pages_cached"] <= total
        with pytest.raises(SpecRagError, match="needs .* KV pages"):
            eng.submit_generate([], [[5] * 150] * 2, max_new_tokens=100)
        reqs = [eng.submit_generate([], [[6 + i] * 150], max_new_tokens=40) for i in range(4)]  # > pool at once
        assert all(len(r.result(120)[0].token_ids) > 0 for r in reqs)
        assert_pages_home(eng)
    finally:
        eng.stop(drain=False)
        eng.cache.clear()


def test_cancel_timeout_and_errors_release_pages(engine):
    started, release = threading.Event(), threading.Event()

    def gate(_row, _out):  # holds the engine after the first token until the cancel is in (no timing race)
        started.set()
        release.wait(10)
        return False

    slow = engine.submit_generate([], [[7] * 30], max_new_tokens=200, stop_fn=gate)
    assert started.wait(30)
    slow.cancel()
    release.set()
    with pytest.raises(RequestCancelled):
        slow.result(30)

    def dawdle(_row, _out):  # each token takes 50 ms: the request outlives its 10 ms timeout (no race with EOS)
        time.sleep(0.05)
        return False

    timed = engine.submit_generate([], [[7] * 30], max_new_tokens=200, timeout=0.01, stop_fn=dawdle)
    with pytest.raises(RequestTimeout):
        timed.result(30)
    with pytest.raises(SpecRagError, match="empty prompt"):
        engine.submit_generate([], [[]], max_new_tokens=3)
    with pytest.raises(SpecRagError, match="outside the vocabulary"):
        engine.submit_generate([], [[5, 999]], max_new_tokens=3)

    def broken(_row, _out):
        raise RuntimeError("listener bug")

    with pytest.raises(EngineError, match="listener bug"):
        engine.submit_generate([], [[9] * 10], max_new_tokens=5, stop_fn=broken).result(30)
    assert engine.submit_generate([], [[9] * 10], max_new_tokens=5).result(30)[0].token_ids  # still serving
    assert_pages_home(engine)


def test_queue_full_and_shutdown_drain(tiny_model):
    eng = Engine(tiny_model.runner, name="q", config=SchedulerConfig(max_queue=2, max_running=1)).start()
    try:
        reqs, refused = [], 0
        for i in range(8):
            try:
                reqs.append(eng.submit_generate([], [[9 + i] * 8], max_new_tokens=20))
            except QueueFull:
                refused += 1
        assert refused > 0
        eng.stop(drain=True)  # finishes everything accepted
        assert all(len(r.result(1)[0].token_ids) == 20 for r in reqs)
        with pytest.raises(EngineStopped):
            eng.submit_generate([], [[5]], max_new_tokens=1)
        assert_pages_home(eng)
        eng.start()
        reqs = [eng.submit_generate([], [[10 + i] * 8], max_new_tokens=50) for i in range(2)]
        eng.stop(drain=False)  # cancels in-flight work
        assert all(isinstance(r.future.exception(5), RequestCancelled) or r.future.done() for r in reqs)
        assert_pages_home(eng)
    finally:
        eng.stop(drain=False)
        eng.cache.clear()


def test_backpressure_shrinks_when_busy_and_grows_when_idle():
    bp = Backpressure(SchedulerConfig(token_budget=256, min_prefill_chunk=32, busy_decoders=4))
    assert bp.update(0, 1.0) == 256
    assert [bp.update(8, 1.0) for _ in range(4)] == [128, 64, 32, 32]
    assert bp.update(1, 0.05) == 32  # nearly full pool keeps it small
    assert bp.update(2, 0.9) == 32  # moderate load: hold
    assert [bp.update(0, 0.9) for _ in range(3)] == [64, 128, 256]
    fixed = Backpressure(SchedulerConfig(token_budget=256, backpressure=False))
    assert fixed.update(50, 0.01) == 256


def test_results_split_their_compile_seconds_by_phase():
    """A fresh model's first request compiles its prefill and decode programs on the engine's thread, each counted
    in its own phase (within that phase's seconds); a request of the same shapes after it compiles nothing."""
    # a pool and context no other test uses: its step programs are not in this process's jit caches yet
    model = tiny_text_model("tiny:llama", seed=13, num_pages=37, page_size=4, max_seq_len=132)
    engine = Engine(model.runner, model.generator.eos_ids, name="compile").start()
    other = [5 + (t + 1) % 60 for t in PROMPTS[4]]  # same length, no shared prefix: the same step shapes
    tree = Tree([50, 51, 52], [-1, 0, -1], [21, 22, 21], [0, 1, 2], [51, 60, 53])
    try:
        first = engine.submit_generate([], [PROMPTS[4]], max_new_tokens=5).result(120)[0]
        again = engine.submit_generate([], [other], max_new_tokens=5).result(60)[0]
        scored = engine.submit_score(list(range(10, 31)), tree)
        scored.future.result(120)
        engine.reset_prefix_cache()  # the same steps again: the whole prefix prefilled, then the tree
        rescored = engine.submit_score(list(range(10, 31)), tree)
        rescored.future.result(60)
    finally:
        engine.stop(drain=False)
        engine.cache.clear()
    assert 0 < first.prefill_compile_s <= first.prefill_s and 0 < first.decode_compile_s <= first.decode_s
    assert again.prefill_compile_s == again.decode_compile_s == 0.0
    assert scored.compile_s > 0 and rescored.compile_s == 0.0  # on the engine's own thread, not this one
