"""The engine's sampler per request: penalties against a numpy replay of the model's logits, top log-probabilities
exact under speculation (greedy: the same tokens and numbers as plain decoding), seeds, several choices."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import pages_needed
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.generation import Phase
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation
from specrag_jax.models.speculative.ngram_proposer import NgramProposer
from tests.models.engine.conftest import assert_pages_home
from tests.models.sampling.test_penalties import log_softmax_ref

REPEATING = [5 + j % 6 for j in range(30)]  # the n-gram proposer finds continuations in it


def fresh_logits(runner, context) -> np.ndarray:
    """The model's logits after ``context`` (a fresh prefill; no engine running on the runner)."""
    pages = runner.allocator.allocate(pages_needed(len(context), runner.page_size))
    try:
        return runner.logits(runner.pack([Chunk(pages, 0, list(context), rows=[len(context) - 1])]))[0]
    finally:
        runner.allocator.release(pages)


def penalize_np(logits, prompt, out, sp: SamplingParams):
    counts = np.bincount(np.asarray(out, int), minlength=logits.shape[0]).astype(np.float32)
    seen = counts > 0
    seen[list(prompt)] = True
    r = np.float32(sp.repetition_penalty)
    x = np.where(seen, np.where(logits > 0, logits / r, logits * r), logits)
    return x - np.float32(sp.frequency_penalty) * counts - np.float32(sp.presence_penalty) * (counts > 0)


def run(engine: Engine, *args, **kw):
    """One request on a fresh engine over the shared runner; its pages (cached ones too) go back after."""
    engine.start()
    try:
        return engine.submit_generate(*args, **kw).result(120)
    finally:
        engine.stop()
        assert_pages_home(engine)
        engine.cache.clear()


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(presence_penalty=1.5, frequency_penalty=0.7, top_logprobs=4),
        SamplingParams(repetition_penalty=3.0, top_logprobs=4),
        SamplingParams(presence_penalty=-2.0, repetition_penalty=0.5, top_logprobs=4),
    ],
)
def test_penalised_greedy_decoding_follows_the_numpy_reference(tiny_model, sp):
    prompt = REPEATING[:12]
    [res] = run(Engine(tiny_model.runner, name="pen"), [], [prompt], sp, max_new_tokens=8)
    [plain] = run(Engine(tiny_model.runner, name="plain"), [], [prompt], SamplingParams(), max_new_tokens=8)
    assert res.token_ids != plain.token_ids  # the penalties changed the text (else this test proves nothing)
    for k, tok in enumerate(res.token_ids):
        want = penalize_np(fresh_logits(tiny_model.runner, prompt + res.token_ids[:k]), prompt, res.token_ids[:k], sp)
        ref = log_softmax_ref(want)
        assert tok == int(np.argmax(want)), f"token {k}"
        np.testing.assert_allclose(res.logprobs[k], ref[tok], atol=1e-4)
        ids, lps = res.top_logprobs[k]
        assert ids[0] == tok and len(ids) == 4
        np.testing.assert_allclose(lps, np.sort(ref)[::-1][:4], atol=1e-4)


def test_speculation_returns_the_plain_tokens_and_logprobs(tiny_model):
    sp = SamplingParams(top_logprobs=5)
    prompts = [REPEATING[i:] for i in range(3)]
    plain = run(Engine(tiny_model.runner, name="plain"), [], prompts, sp, max_new_tokens=20)
    spec_engine = Engine(tiny_model.runner, name="spec")
    spec = run(spec_engine, [], prompts, sp, max_new_tokens=20, speculation=Speculation(NgramProposer(), 16))
    assert spec_engine.counters["spec_accepted"] > 0  # trees were verified and tokens accepted
    for g, w in zip(spec, plain):
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-4)
        assert [ids for ids, _ in g.top_logprobs] == [ids for ids, _ in w.top_logprobs]
        np.testing.assert_allclose([v for _, v in g.top_logprobs], [v for _, v in w.top_logprobs], atol=1e-4)


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(frequency_penalty=0.3, presence_penalty=0.1, top_logprobs=3),
        SamplingParams(repetition_penalty=1.3, top_logprobs=3),
    ],
)
def test_penalised_speculation_returns_the_plain_tokens_and_logprobs(tiny_model, sp):
    """Each tree node is penalised with the counts plus its own path: the same text as plain decoding."""
    prompts = [REPEATING[i:] for i in range(3)]
    plain = run(Engine(tiny_model.runner, name="plain"), [], prompts, sp, max_new_tokens=20)
    [unpenalised] = run(Engine(tiny_model.runner, name="free"), [], prompts[:1], SamplingParams(), max_new_tokens=20)
    assert plain[0].token_ids != unpenalised.token_ids  # the penalties matter here
    eng = Engine(tiny_model.runner, name="spec")
    spec = run(eng, [], prompts, sp, max_new_tokens=20, speculation=Speculation(NgramProposer(), 16))
    assert eng.counters["spec_accepted"] > 0
    for g, w in zip(spec, plain):
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-4)
        np.testing.assert_allclose([v for _, v in g.top_logprobs], [v for _, v in w.top_logprobs], atol=1e-4)
    assert tiny_model.runner.penalties.num_free == tiny_model.runner.penalties.capacity  # slots returned


def test_seeds_reproduce_and_branches_differ(tiny_model):
    eng = Engine(tiny_model.runner, name="seed").start()
    try:

        def texts(seed, n=1):
            sps = [SamplingParams(1.0, seed=seed + 7919 * i) for i in range(n)]
            return [r.token_ids for r in eng.submit_generate(REPEATING[:8], [[]] * n, sps, 12).result(120)]

        assert texts(11) == texts(11)
        assert texts(11) != texts(12)
        three = texts(11, 3)
        assert three[0] == texts(11)[0] and len({tuple(t) for t in three}) == 3
        shared = eng.submit_generate(REPEATING[:8], [[]] * 3, SamplingParams(), 2).result(120)
        assert [r.shared_prefix_tokens for r in shared] == [4] * 3  # the prompt's full page, once for all
        with pytest.raises(SpecRagError, match="phases"):
            eng.submit_phases([1, 2], [[3]], [Phase(2)], sampling=SamplingParams(presence_penalty=1.0))
    finally:
        eng.stop()
        assert_pages_home(eng)
        eng.cache.clear()
