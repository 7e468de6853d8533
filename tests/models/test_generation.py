"""Generation on tiny random models of both families: batching, paging, chunking, compilation, errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.generation import Generator, Phase, finish_reason, greedy_generate
from specrag_jax.models.sampling.params import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [20 + i for i in range(13)]]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    cfg = tiny_config(request.param, tie_embeddings=request.param == "gemma3")
    return cfg, init_params(cfg, seed=1)


def runner(model, **kw):
    cfg, params = model
    kw.setdefault("num_pages", 64)
    kw.setdefault("page_size", 4)
    kw.setdefault("max_seq_len", 128)
    return ModelRunner(cfg, params, **kw)


def test_batched_equals_one_by_one(model):
    r = runner(model)
    batched = greedy_generate(r, PROMPTS, 12)
    assert batched == [greedy_generate(r, [p], 12)[0] for p in PROMPTS]
    assert r.allocator.num_free == r.allocator.num_usable


def test_paged_equals_contiguous(model):
    contiguous = runner(model, page_size=128, num_pages=8)
    paged = runner(model, page_size=2, num_pages=200)
    held = paged.allocator.allocate(60)  # fragment the pool so sequences get scattered pages
    paged.allocator.release(held[::2])
    a = Generator(contiguous).generate(PROMPTS, max_new_tokens=10)
    b = Generator(paged).generate(PROMPTS, max_new_tokens=10)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    np.testing.assert_allclose([x.logprobs for x in a], [x.logprobs for x in b], atol=1e-5)


def test_chunked_prefill_equals_single_pass(model):
    r = runner(model)
    whole = Generator(r, max_prefill_tokens=512).generate(PROMPTS, max_new_tokens=6)
    chunked = Generator(r, max_prefill_tokens=5).generate(PROMPTS, max_new_tokens=6)
    assert [x.token_ids for x in whole] == [x.token_ids for x in chunked]


def test_incremental_decode_matches_full_sequence_scoring(model):
    r = runner(model)
    prompt = PROMPTS[2]
    res = Generator(r).generate([prompt], max_new_tokens=8)[0]
    seq = prompt + res.token_ids
    pages = r.allocator.allocate(-(-len(seq) // r.page_size))
    try:
        rows = list(range(len(prompt) - 1, len(seq) - 1))
        step = r.pack([Chunk(pages, 0, seq, rows=rows)])
        full = r.score(step, res.token_ids)
    finally:
        r.allocator.release(pages)
    np.testing.assert_allclose(full, res.logprobs, atol=1e-5)


def _compiles(calls) -> int:
    """Backend compilations while running ``calls`` (0 after a complete warm-up)."""
    compiles: list[str] = []

    def listener(name, _duration, **_kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        calls()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return len(compiles)


def test_no_recompilation_after_warmup(model):
    r = runner(model, max_seq_len=256, num_pages=80)
    gen = Generator(r, max_prefill_tokens=64)
    gen.warmup(max_prompt_len=100, max_new_tokens=5)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 101, size=20)
    assert (
        _compiles(lambda: [gen.generate([list(rng.integers(3, 90, size=int(n)))], max_new_tokens=5) for n in lengths])
        == 0
    )


def test_no_recompilation_after_warmup_for_batches(model):
    """Warm-up enumerates the decode widths (exact up to 8 sequences) and the prefill sequence buckets."""
    r = runner(model, max_seq_len=128, num_pages=96)
    gen = Generator(r, max_prefill_tokens=64)
    gen.warmup(max_prompt_len=40, max_new_tokens=4, batch_sizes=(5,))
    rng = np.random.default_rng(1)
    batches = [[list(rng.integers(3, 90, size=int(k))) for k in rng.integers(1, 41, size=n)] for n in (5, 3, 2, 5)]
    assert _compiles(lambda: [gen.generate(prompts, max_new_tokens=4) for prompts in batches]) == 0


def test_sampling_is_seeded_and_batch_invariant(model):
    r = runner(model)
    sp = SamplingParams(temperature=0.9, top_k=30, top_p=0.9, seed=7)
    gen = Generator(r)
    batch = gen.generate(PROMPTS, sp, max_new_tokens=8)
    alone = gen.generate([PROMPTS[1]], sp, max_new_tokens=8)[0]
    assert batch[1].token_ids == alone.token_ids
    other = gen.generate([PROMPTS[1]], SamplingParams(temperature=0.9, seed=8), max_new_tokens=8)[0]
    assert other.token_ids != alone.token_ids


def test_top_k_one_is_greedy(model):
    r = runner(model)
    greedy = greedy_generate(r, [PROMPTS[0]], 8)[0]
    sampled = Generator(r).generate([PROMPTS[0]], SamplingParams(temperature=1.5, top_k=1, seed=3), 8)[0]
    assert sampled.token_ids == greedy


def test_eos_and_stop_fn_end_generation(model):
    r = runner(model)
    greedy = greedy_generate(r, [PROMPTS[0]], 8)[0]
    eos = greedy[3]
    res = Generator(r, eos_ids=[eos]).generate([PROMPTS[0]], max_new_tokens=8)[0]
    assert res.token_ids == greedy[: greedy.index(eos) + 1] and res.finish_reason == "eos"
    res = Generator(r).generate([PROMPTS[0]], max_new_tokens=8, stop_fn=lambda row, ids: len(ids) == 2)[0]
    assert res.token_ids == greedy[:2] and res.finish_reason == "stop"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-2), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed=-1), "seed"),
    ],
)
def test_invalid_sampling_parameters(kwargs, message):
    with pytest.raises(SpecRagError, match=message):
        SamplingParams(**kwargs)


def test_bad_prompts_raise_clear_errors_and_leak_nothing(model):
    r = runner(model, max_seq_len=32)
    gen = Generator(r)
    with pytest.raises(SpecRagError, match="empty prompt"):
        gen.generate([[1, 2], []], max_new_tokens=4)
    with pytest.raises(SpecRagError, match=r"40 tokens \+ max_new_tokens 4 exceeds the context of 32"):
        gen.generate([[3] * 40], max_new_tokens=4)
    with pytest.raises(SpecRagError, match="outside the vocabulary"):
        gen.generate([[3, 10_000]], max_new_tokens=4)
    with pytest.raises(SpecRagError, match="max_new_tokens"):
        gen.generate([[3]], max_new_tokens=0)
    assert r.allocator.num_free == r.allocator.num_usable


def test_pages_are_released_when_a_step_fails(model):
    r = runner(model)
    gen = Generator(r)

    def boom(row, ids):
        raise RuntimeError("client went away")

    with pytest.raises(SpecRagError, match="client went away"):
        gen.generate(PROMPTS, max_new_tokens=4, stop_fn=boom)
    assert r.allocator.num_free == r.allocator.num_usable


def test_pool_exhaustion_is_all_or_nothing(model):
    r = runner(model, num_pages=6, page_size=4, max_seq_len=64)
    with pytest.raises(SpecRagError, match="request needs 8 KV pages; the model pool has 5"):
        Generator(r).generate([[3] * 10, [4] * 10], max_new_tokens=4)
    assert r.allocator.num_free == r.allocator.num_usable


def test_shared_prefix_branches_equal_separate_generation(model):
    r = runner(model)
    prefix = [7 + (i % 50) for i in range(11)]  # 2 full pages of 4 shared, 3 tokens recomputed per branch
    suffixes = [[60, 61], [62], [63, 64, 65, 66]]
    gen = Generator(r)
    shared = gen.generate_branches(prefix, suffixes, max_new_tokens=8)
    alone = [gen.generate([prefix + s], max_new_tokens=8)[0] for s in suffixes]
    assert [x.token_ids for x in shared] == [x.token_ids for x in alone]
    np.testing.assert_allclose([x.logprobs for x in shared], [x.logprobs for x in alone], atol=1e-5)
    assert all(x.shared_prefix_tokens == 8 for x in shared)
    assert r.allocator.num_free == r.allocator.num_usable


@pytest.mark.parametrize("keep", [0, 3, 99])  # drop everything, keep a prefix, keep all (last token re-fed)
def test_phases_keep_kv_and_equal_regenerating(model, keep):
    """Phase 2 continues from phase 1's K/V; it equals a fresh generation over the same full prompt."""
    r = runner(model)
    prefix = [7 + (i % 50) for i in range(9)]
    suffixes = [[60, 61], [62], [63, 64, 65, 66, 67, 68]]
    forced = [40, 41, 42]
    gen = Generator(r)
    seen = []

    def between(phase, row, res):
        seen.append((phase, row))
        return keep, forced

    first, second = gen.generate_phases(prefix, suffixes, [Phase(6), Phase(5)], between)
    assert seen == [(0, 0), (0, 1), (0, 2)]
    assert r.allocator.num_free == r.allocator.num_usable
    for suffix, a, b in zip(suffixes, first, second):
        full = prefix + suffix + a.token_ids[:keep] + forced
        [fresh] = gen.generate([full], max_new_tokens=5)
        assert b.num_prompt_tokens == len(full)
        assert b.token_ids == fresh.token_ids
        np.testing.assert_allclose(b.logprobs, fresh.logprobs, atol=1e-5)
    [single] = gen.generate_phases(prefix, suffixes, [Phase(6)])
    assert [x.token_ids for x in single] == [x.token_ids for x in first]


def test_phases_release_pages_when_a_phase_fails(model):
    r = runner(model, num_pages=12, page_size=4, max_seq_len=64)
    gen = Generator(r)
    with pytest.raises(SpecRagError):  # phase 2 needs more pages than the pool has left
        gen.generate_phases([3] * 5, [[4], [5]], [Phase(2), Phase(4)], lambda p, row, res: (2, [9] * 20))
    assert r.allocator.num_free == r.allocator.num_usable
    with pytest.raises(SpecRagError, match="max_new_tokens"):
        gen.generate_phases([3], [[4]], [Phase(2), Phase(0)])


def test_finish_reason_order_eos_then_stop_then_length():
    """The one stop rule (Generator and serving engine): EOS wins over a stop condition, which wins over length."""
    stop_at_7 = lambda _row, out: out[-1] == 7  # noqa: E731
    assert finish_reason(2, [5, 2], 0, {2}, stop_at_7, 2) == "eos"
    assert finish_reason(7, [5, 7], 0, {2}, stop_at_7, 2) == "stop"
    assert finish_reason(6, [5, 6], 0, {2}, stop_at_7, 2) == "length"
    assert finish_reason(6, [5, 6], 0, {2}, None, 3) is None
    assert finish_reason(6, [6], 1, (), lambda row, _out: row == 1, 3) == "stop"  # the row is passed through
