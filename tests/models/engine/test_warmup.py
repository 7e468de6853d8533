"""Warm-up: after compiling the engine's step shapes, mixed concurrent traffic compiles nothing more."""

from __future__ import annotations

import pytest

from specrag_jax.compile_time import CompileClock
from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.engine.policy import SchedulerConfig
from specrag_jax.models.engine.requests import Tree
from specrag_jax.models.engine.warmup import enable_compile_cache, step_shapes
from specrag_jax.models.generation import Phase
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.serving.tiny import tiny_text_model
from tests.models.engine.conftest import assert_pages_home


@pytest.fixture(scope="module")
def small_engine():
    # 64-token context in pages of 4: one page-table bucket; 16 sequences and 64 tokens per step at most.
    model = tiny_text_model("tiny:llama", seed=7, num_pages=160, page_size=4, max_seq_len=64)
    cfg = SchedulerConfig(token_budget=64, max_running=16, min_step_seqs=8, min_step_tokens=64)
    return Engine(model.runner, model.generator.eos_ids, name="warm", config=cfg)


def test_shapes_cover_decode_prefill_and_score(small_engine):
    shapes = step_shapes(small_engine, "full")
    kinds = {(s.kind, s.seqs, s.rows, s.greedy) for s in shapes}
    assert ("decode", 16, 16, False) in kinds and ("prefill", 8, 8, True) in kinds and ("score", 8, 64, True) in kinds
    assert len(step_shapes(small_engine, "decode")) == 4  # 2 sequence buckets x greedy/sampled
    assert step_shapes(small_engine, "none") == []
    with pytest.raises(SpecRagError, match="warm-up level"):
        step_shapes(small_engine, "most")


def test_no_compilation_after_warmup(small_engine):
    report = small_engine.warmup("full")
    assert report.programs == len(step_shapes(small_engine, "full"))
    engine = small_engine.start()
    try:
        with pytest.raises(SpecRagError, match="before start"):
            engine.warmup("decode")
        greedy, sampled = SamplingParams(), SamplingParams(temperature=0.9, top_p=0.8, seed=3)
        penalised = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2, top_logprobs=5)
        kinds = [greedy, sampled, penalised, SamplingParams(0.7, seed=9, repetition_penalty=1.1, top_logprobs=20)]
        with CompileClock() as clock:
            reqs = [
                engine.submit_generate([], [[5 + i + j for j in range(3 + 3 * i)]], kinds[i % 4], max_new_tokens=6 + i)
                for i in range(12)
            ]
            reqs.append(engine.submit_generate(list(range(30, 39)), [[]] * 3, [penalised] * 3, max_new_tokens=5))
            reqs.append(
                engine.submit_phases(
                    list(range(10, 30)), [[40], [41, 42], [43]], [Phase(5), Phase(3)], lambda p, r, res: (1, [7, 8])
                )
            )
            reqs += [
                engine.submit_score(
                    list(range(20, 20 + n)), Tree([50, 51, 52], [-1, 0, -1], [n, n + 1, n], [0, 1, 2], [51, 9, 60])
                )
                for n in (5, 30)
            ]
            for r in reqs:
                r.result(120)
        assert clock.seconds == 0.0, f"{clock.seconds:.2f} s of compilation after warm-up"
        assert_pages_home(engine)
    finally:
        engine.stop(drain=False)
        engine.cache.clear()


def test_compile_cache_directory_errors_name_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpecRagError, match="compilation cache directory"):
        enable_compile_cache(blocker / "sub")


def test_map_budget_refuses_a_warmup_the_process_cannot_map(tmp_path):
    from specrag_jax.models.engine.warmup import check_map_budget

    limit, maps = tmp_path / "max_map_count", tmp_path / "maps"
    limit.write_text("65530\n")
    maps.write_text("region\n" * 2000)  # a freshly started server
    check_map_budget(40, str(limit), str(maps))  # the default decode warm-up of both engines
    with pytest.raises(SpecRagError, match="vm.max_map_count is 65530"):
        check_map_budget(60 + 105, str(limit), str(maps))  # --warmup full of both real models: crashed here
