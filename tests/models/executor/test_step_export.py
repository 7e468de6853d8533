"""Stored exported steps: identical outputs to the traced steps, the pool still donated, new code = new entry."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from specrag_jax.compile_time import CompileClock
from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor import step_export
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.generation import greedy_generate


def runner(arch: str) -> ModelRunner:
    cfg = tiny_config(arch)
    return ModelRunner(cfg, init_params(cfg), num_pages=32, page_size=4, max_seq_len=64)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])  # qwen2 runs the llama path plus biases
def test_exported_steps_equal_traced_steps(tmp_path, monkeypatch, arch):
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12]]
    monkeypatch.setenv(step_export.ENV, "off")
    traced = runner(arch)
    want = greedy_generate(traced, prompts, 6)
    pages = traced.allocator.allocate(4)
    want_scores = traced.score(traced.pack([Chunk(pages, 0, prompts[0], rows=[0, 1, 2])]), [4, 5, 6])
    traced.allocator.release(pages)
    monkeypatch.setenv(step_export.ENV, str(tmp_path / "exported"))
    for attempt in ("export", "load"):  # the first runner writes the entries, the second reads them
        ours = runner(arch)
        assert greedy_generate(ours, prompts, 6) == want, attempt
        pages = ours.allocator.allocate(4)
        old_pool = ours.pool.k[0]
        scores = ours.score(ours.pack([Chunk(pages, 0, prompts[0], rows=[0, 1, 2])]), [4, 5, 6])
        assert old_pool.is_deleted()  # donated through the exported call
        np.testing.assert_array_equal(scores, want_scores)
        ours.allocator.release(pages)
        assert ours._exported is not None and all(fn is not None for fn in ours._exported._fns.values())
    assert len(list((tmp_path / "exported").glob("*.jaxexport"))) >= 2


def test_off_without_a_compilation_cache(monkeypatch):
    monkeypatch.delenv(step_export.ENV, raising=False)
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert step_export.export_dir() is None
        jax.config.update("jax_compilation_cache_dir", "/some/cache/xla")
        assert str(step_export.export_dir()) == "/some/cache/xla_exported"
        monkeypatch.setenv(step_export.ENV, "off")
        assert step_export.export_dir() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_other_code_writes_a_new_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(step_export.ENV, str(tmp_path))
    greedy_generate(runner("llama"), [[3, 4, 5]], 2)
    first = set(tmp_path.glob("*.jaxexport"))
    assert first and len(step_export.code_fingerprint()) == 64
    monkeypatch.setattr(step_export, "code_fingerprint", lambda: "edited sources")
    greedy_generate(runner("llama"), [[3, 4, 5]], 2)
    assert set(tmp_path.glob("*.jaxexport")) > first  # same shapes, other code: other files


def test_corrupt_entry_falls_back_to_tracing(tmp_path, monkeypatch):
    monkeypatch.setenv(step_export.ENV, str(tmp_path))
    want = greedy_generate(runner("llama"), [[3, 4, 5]], 3)
    for path in tmp_path.glob("*.jaxexport"):
        path.write_bytes(b"not a flatbuffer")
    with pytest.warns(UserWarning, match="not exported"):
        assert greedy_generate(runner("llama"), [[3, 4, 5]], 3) == want


def test_fingerprint_hashes_every_subpackage():
    """The export key covers the sources of every models/ subpackage and of kernels/, so a stored step is never
    reused after any of them changes."""
    names = {p.as_posix().rsplit("/specrag_jax/", 1)[1] for p in step_export.source_files()}
    for expected in (
        "models/config.py",
        "models/decoder/transformer.py",
        "models/executor/runner.py",
        "models/speculative/verify_step.py",
        "kernels/reference.py",
    ):
        assert expected in names, expected


def test_held_programs_bounds_the_programs_kept_and_tokens_do_not_change(tmp_path, monkeypatch):
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12]]
    monkeypatch.setenv(step_export.ENV, str(tmp_path / "exported"))
    unbounded = runner("llama")
    want = greedy_generate(unbounded, prompts, 6)
    used = len(unbounded._exported._fns)
    assert used >= 2  # a prefill and a decode shape: more programs than the limit below
    with step_export.held_programs(1):
        ours = runner("llama")
        for _ in range(2):  # the second round reloads the programs the first one dropped
            with CompileClock() as clock:
                assert greedy_generate(ours, prompts, 6) == want
            assert len(ours._exported._fns) == 1
            assert clock.stats.programs >= used  # each dropped program was loaded again when needed
    assert step_export._held == [None]  # restored after the block
    with step_export.held_programs(2):
        with pytest.raises(SpecRagError, match="at least 1"):
            with step_export.held_programs(0):
                pass
        assert step_export._held == [2]
