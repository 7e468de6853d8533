"""Token-tree speculation in the engine: greedy exactness under concurrency, mixed traffic, streaming, page
accounting on cancellation and proposer errors, backpressure on tree budgets, warm-up (the serve flags and HTTP:
``tests/serving/test_serve_speculation.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.compile_time import CompileClock
from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import pages_needed
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.policy import Backpressure, SchedulerConfig
from specrag_jax.models.engine.requests import EngineError, RequestCancelled, Tree
from specrag_jax.models.engine.warmup import step_shapes
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.generation import Generator, Phase
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation
from specrag_jax.models.speculative.ngram_proposer import NgramProposer
from specrag_jax.serving.tiny import tiny_text_model
from tests.models.engine.conftest import assert_pages_home

PROMPTS = [[5 + (i * 7 + j) % 60 for j in range(3 + 5 * i)] for i in range(8)]
NEW = 24


def top2_gap(runner, context) -> float:
    """The verifier's top-2 logit gap after ``context`` (a fresh prefill; call with no engine running)."""
    pages = runner.allocator.allocate(pages_needed(len(context), runner.page_size))
    try:
        logits = runner.logits(runner.pack([Chunk(pages, 0, list(context), rows=[len(context) - 1])]))[0]
    finally:
        runner.allocator.release(pages)
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def near_ties(runner, prompts, got, want) -> int:
    """Compare greedy results token for token (logprobs to 1e-4); every difference must sit at a near-tie
    (top-2 logit gap < 1e-4) of the plain context. Returns how many sequences differ."""
    ties = 0
    for p, g, w in zip(prompts, got, want):
        k = next((i for i, (a, b) in enumerate(zip(g.token_ids, w.token_ids)) if a != b), None)
        np.testing.assert_allclose(g.logprobs[:k], w.logprobs[:k], atol=1e-4)
        if k is None:
            assert g.token_ids == w.token_ids
            continue
        gap = top2_gap(runner, list(p) + w.token_ids[:k])
        assert gap < 1e-4, f"differs at token {k} where the top-2 logit gap is {gap}"
        ties += 1
    return ties


def oracle(prompts, outputs, wrong=(1, 2, 3)):
    """Per prompt: a wrong branch plus the true next tokens (many accepted per step, off chunk order)."""

    def make(full):
        return lambda ctx: [list(wrong), full[len(ctx) : len(ctx) + 7], full[len(ctx) : len(ctx) + 2] + [0]]

    return [make(list(p) + o.token_ids) for p, o in zip(prompts, outputs)]


@pytest.fixture(scope="module")
def model():
    return tiny_text_model("tiny:llama", seed=3, num_pages=320, page_size=4, max_seq_len=256)


@pytest.fixture(scope="module")
def plain(model):
    return Generator(model.runner, model.generator.eos_ids).generate(PROMPTS, max_new_tokens=NEW)


def run_engine(model, config=None):
    return Engine(model.runner, model.generator.eos_ids, name="spec", config=config).start()


def stop(engine):
    engine.stop(drain=False)
    engine.cache.clear()


@pytest.mark.parametrize("kind", ["ngram", "oracle"])
def test_greedy_speculation_equals_plain_generator_under_8_concurrent_requests(model, plain, kind):
    props = [NgramProposer()] * 8 if kind == "ngram" else oracle(PROMPTS, plain)
    eng = run_engine(model)
    try:
        reqs = [
            eng.submit_generate([], [p], max_new_tokens=NEW, speculation=Speculation(f, 16))
            for p, f in zip(PROMPTS, props)
        ]
        got = [r.result(120)[0] for r in reqs]
        st = eng.stats()
        assert_pages_home(eng)
    finally:
        stop(eng)
    assert near_ties(model.runner, PROMPTS, got, plain) <= 1
    assert st["spec_steps"] > 0 and st["spec_accepted"] > 0 and st["spec_emitted"] > st["spec_seq_steps"]
    assert all(g.speculation is not None and g.speculation.emitted == len(g.token_ids) - 1 for g in got)
    if kind == "oracle":  # the true branch is in every tree: several tokens per verifier step
        assert sum(g.speculation.emitted for g in got) / sum(g.speculation.steps for g in got) > 3


def test_mixed_traffic_speculating_plain_scoring_and_phases(model, plain):
    r = model.runner
    ref = Generator(r, model.generator.eos_ids)
    prefix, suffixes = list(range(10, 31)), [[40, 41], [42], [43, 44, 45]]
    branches = ref.generate_branches(prefix, suffixes, max_new_tokens=10)
    phases, between = [Phase(8), Phase(6)], (lambda p, row, res: (3, [40, 41]))
    phased = ref.generate_phases([5, 6], [[7, 8], [9]], phases, between)
    tree = Tree([50, 51, 52, 53], [-1, 0, -1, 2], [21, 22, 21, 22], [0, 1, 2, 3], [51, 60, 53, 61])
    scores = ref.score_tree(prefix, tree.tokens, tree.parents, tree.positions, tree.rows, tree.targets)
    eng = run_engine(model)
    try:
        spec = [
            eng.submit_generate([], [p], max_new_tokens=NEW, speculation=Speculation(NgramProposer(), 16))
            for p in PROMPTS[::2]
        ]
        plain_reqs = [eng.submit_generate([], [p], max_new_tokens=NEW) for p in PROMPTS[1::2]]
        group = eng.submit_generate(
            prefix,
            suffixes,
            max_new_tokens=10,
            speculation=Speculation(oracle([prefix + s for s in suffixes], branches), 8),
        )
        ph = eng.submit_phases([5, 6], [[7, 8], [9]], phases, between, speculation=Speculation(NgramProposer(), 8))
        score = eng.submit_score(prefix, tree)
        got_spec = [q.result(120)[0] for q in spec]
        got_plain = [q.result(120)[0] for q in plain_reqs]
        got_group, got_ph, got_score = group.result(120), ph.result(120), score.result(120)
        assert eng.stats()["spec_steps"] > 0
        assert_pages_home(eng)
    finally:
        stop(eng)
    assert near_ties(r, PROMPTS[::2], got_spec, plain[::2]) + near_ties(r, PROMPTS[1::2], got_plain, plain[1::2]) <= 1
    assert [g.token_ids for g in got_group] == [b.token_ids for b in branches]
    assert [[g.token_ids for g in p] for p in got_ph] == [[g.token_ids for g in p] for p in phased]
    assert all(g.speculation is not None for p in got_ph for g in p)
    np.testing.assert_allclose(got_score, scores, atol=1e-5)


def test_streaming_sends_accepted_tokens_in_order_and_stops_exactly(model, plain):
    stop_at = {i: plain[i].token_ids[9] for i in range(8)}
    eng = run_engine(model)
    try:
        streams: dict[int, list[int]] = {i: [] for i in range(8)}
        reqs = [
            eng.submit_generate(
                [],
                [p],
                max_new_tokens=NEW,
                stop_fn=lambda _b, out, i=i: out[-1] == stop_at[i],
                on_token=lambda _b, t, i=i: streams[i].append(t),
                speculation=Speculation(f, 16),
            )
            for i, (p, f) in enumerate(zip(PROMPTS, oracle(PROMPTS, plain)))
        ]
        got = [q.result(120)[0] for q in reqs]
        short = eng.submit_generate(
            [], [PROMPTS[2]], max_new_tokens=5, speculation=Speculation(oracle(PROMPTS, plain)[2], 16)
        ).result(120)[0]
        assert_pages_home(eng)
    finally:
        stop(eng)
    for i, g in enumerate(got):
        k = plain[i].token_ids.index(stop_at[i])
        assert streams[i] == g.token_ids == plain[i].token_ids[: k + 1] and g.finish_reason == "stop"
    assert short.token_ids == plain[2].token_ids[:5] and short.finish_reason == "length"


def test_cancel_mid_tree_and_a_raising_proposer_leak_no_pages(model, plain):
    eng = run_engine(model)
    box: dict[str, object] = {}

    def cancelling(ctx):  # cancels its own request while a tree step is being built
        if len(ctx) > len(PROMPTS[3]) + 4:
            box["req"].cancel()
        return [[7, 8, 9], [10]]

    seen = []

    def streaming_cancel(_b, t):  # cancels while the accepted tokens of a tree step are being emitted
        seen.append(t)
        if len(seen) == 4:
            box["req2"].cancel()

    calls = []

    def raising(ctx):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("proposer broke")
        return [[1, 2, 3]]

    try:
        box["req"] = eng.submit_generate([], [PROMPTS[3]], max_new_tokens=NEW, speculation=Speculation(cancelling))
        box["req2"] = eng.submit_generate(
            [],
            [PROMPTS[4]],
            max_new_tokens=NEW,
            on_token=streaming_cancel,
            speculation=Speculation(oracle(PROMPTS, plain)[4]),
        )
        bad = eng.submit_generate([], [PROMPTS[5]], max_new_tokens=NEW, speculation=Speculation(raising))
        vocab = eng.submit_generate([], [PROMPTS[6]], max_new_tokens=NEW, speculation=Speculation(lambda c: [[5000]]))
        fine = eng.submit_generate([], [PROMPTS[7]], max_new_tokens=NEW, speculation=Speculation(NgramProposer()))
        for req in (box["req"], box["req2"]):
            with pytest.raises(RequestCancelled):
                req.result(120)
        with pytest.raises(EngineError, match="proposer broke"):
            bad.result(120)
        with pytest.raises(SpecRagError, match="outside the vocabulary"):
            vocab.result(120)
        good = fine.result(120)[0]
        assert_pages_home(eng)
        assert eng.stats()["cancelled"] == 2
    finally:
        stop(eng)
    assert near_ties(model.runner, PROMPTS[7:], [good], plain[7:]) == 0


def test_backpressure_shrinks_tree_budgets_down_to_plain_decoding(model, plain):
    bp = Backpressure(SchedulerConfig(token_budget=256))
    assert [bp.tree_budget(w, 64) for w in (4, 8, 16, 32, 64)] == [64, 32, 16, 8, None]
    assert bp.tree_budget(4, 16) == 16
    for budget, shrunk in ((64, "spec_budget_shrunk_steps"), (32, "spec_plain_fallback_steps")):
        eng = run_engine(model, SchedulerConfig(token_budget=budget))  # 8 trees: 8 x 8 fits 64, not 32
        try:
            reqs = [
                eng.submit_generate([], [p], max_new_tokens=NEW, speculation=Speculation(f, 32))
                for p, f in zip(PROMPTS, oracle(PROMPTS, plain))
            ]
            got = [q.result(120)[0] for q in reqs]
            st = eng.stats()
            assert_pages_home(eng)
        finally:
            stop(eng)
        assert st[shrunk] > 0 and "spec_budget_32_steps" not in st
        assert near_ties(model.runner, PROMPTS, got, plain) <= 1


def test_admission_reserves_the_tree_slots(model):
    eng = Engine(model.runner, name="adm")
    spec = eng._generate_request([], [[5] * 10], SamplingParams(), 20, None, None, Speculation(NgramProposer(), 32))
    plain = eng._generate_request([], [[5] * 10], SamplingParams(), 20, None, None)
    assert eng.admitter.admit(spec) and eng.admitter.admit(plain)
    assert [len(s.pages) for s in spec.seqs + plain.seqs] == [pages_needed(62, 4), pages_needed(30, 4)]
    full = eng._generate_request([], [[5] * 200], SamplingParams(), 56, None, None, Speculation(NgramProposer(), 32))
    assert eng.admitter.admit(full) and len(full.seqs[0].pages) == 256 // 4  # capped at the context
    for r in (spec, plain, full):
        eng.admitter.release(r)
    eng.cache.clear()
    assert model.runner.allocator.num_free == model.runner.allocator.num_usable


def test_no_compilation_after_warmup_with_speculative_traffic():
    m = tiny_text_model("tiny:llama", seed=7, num_pages=200, page_size=4, max_seq_len=64)
    cfg = SchedulerConfig(token_budget=64, max_running=16, min_step_seqs=8, min_step_tokens=64)
    eng = Engine(m.runner, m.generator.eos_ids, name="warm-spec", config=cfg)
    spec = [(s.seqs, s.tokens // s.seqs) for s in step_shapes(eng, "decode", spec_budget=16) if s.kind == "speculate"]
    assert sorted(set(spec)) == [(8, 8)]  # 8 x 8 tokens: the only tree step within the 64-token budget
    with pytest.raises(SpecRagError, match="tree budget"):
        step_shapes(eng, "decode", spec_budget=12)
    report = eng.warmup("full", spec_budget=16)
    assert report.programs == len(step_shapes(eng, "full", spec_budget=16))
    eng.start()
    try:
        sampled = SamplingParams(temperature=0.9, top_p=0.8, seed=3)
        kinds = [
            SamplingParams(),
            sampled,
            SamplingParams(presence_penalty=0.4, repetition_penalty=1.2, top_logprobs=4),
            SamplingParams(0.8, seed=5, frequency_penalty=0.2, top_logprobs=1),
        ]  # penalties, logprobs too
        with CompileClock() as clock:
            reqs = [
                eng.submit_generate(
                    [],
                    [[5 + i + j % 3 for j in range(3 + 2 * i)]],
                    kinds[i % 4],
                    max_new_tokens=8 + i,
                    speculation=Speculation(NgramProposer(), 16),
                )
                for i in range(12)
            ]
            for q in reqs:
                q.result(120)
        assert eng.stats()["spec_steps"] > 0
        assert clock.seconds == 0.0, f"{clock.seconds:.2f} s of compilation after warm-up"
        assert_pages_home(eng)
    finally:
        stop(eng)
