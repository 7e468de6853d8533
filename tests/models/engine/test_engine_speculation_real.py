"""Engine speculation on a real model (slow): Gemma 3 270M, 8 concurrent greedy requests, n-gram proposals vs
plain decoding, token for token up to counted near-ties."""

from __future__ import annotations

import pytest

from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.generation import Generator
from specrag_jax.models.speculative.decode import Speculation, combine_stats
from specrag_jax.models.speculative.ngram_proposer import NgramProposer
from specrag_jax.models.text_model import TextModel
from tests.models.engine.conftest import DOCS, assert_pages_home
from tests.models.engine.test_engine_speculation import near_ties

pytestmark = pytest.mark.slow


def test_gemma3_engine_speculation_equals_plain_greedy_under_8_concurrent_requests():
    model = TextModel.load("gemma3-270m", max_seq_len=512, num_pages=200, page_size=16)
    prompts = [
        model.encode_prompt(f"{d['title']}: {d['text']} {d['title']}: {d['text'][: 12 + 5 * i]}")
        for i, d in enumerate(DOCS * 2)
    ]  # copy-heavy: the passage repeats, so prompt lookup hits
    plain = Generator(model.runner, model.generator.eos_ids).generate(prompts, max_new_tokens=32)
    eng = Engine(model.runner, model.generator.eos_ids, name="gemma").start()
    try:
        reqs = [
            eng.submit_generate([], [p], max_new_tokens=32, speculation=Speculation(NgramProposer(), 16))
            for p in prompts
        ]
        got = [r.result(900)[0] for r in reqs]
        st = eng.stats()
        assert_pages_home(eng)
    finally:
        eng.stop(drain=False)
        eng.cache.clear()
    ties = near_ties(model.runner, prompts, got, plain)
    stats = combine_stats([g.speculation for g in got])
    print(
        f"near-ties: {ties} of {len(prompts)}; speculation: {stats}; engine: "
        f"{ {k: v for k, v in st.items() if k.startswith('spec_')} }"
    )
    assert ties <= 2 and st["spec_steps"] > 0
    assert stats["accepted_tokens_per_step"] > 1.2  # the copied passage is accepted several tokens a step
