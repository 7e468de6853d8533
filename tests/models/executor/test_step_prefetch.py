"""Stored steps loaded ahead of need: the same outputs, nothing compiled on the caller's thread, each program
loaded once whether the worker or the caller gets to it first, and the record of recent steps."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref

import pytest

from specrag_jax.cli import main
from specrag_jax.compile_time import CompileClock, background_stats
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor import step_export, step_prefetch
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.executor.step_prefetch import MISSING, AheadLoader, RecentSteps, wait_for_loads
from specrag_jax.models.generation import greedy_generate

PROMPTS = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12]]


def runner() -> ModelRunner:
    cfg = tiny_config("llama")
    return ModelRunner(cfg, init_params(cfg), num_pages=32, page_size=4, max_seq_len=64)


@pytest.fixture
def prefetch_on():
    step_prefetch.set_prefetch(16)
    yield
    step_prefetch.set_prefetch(0)


def test_a_new_runner_loads_the_recent_steps_ahead_and_its_caller_compiles_none(tmp_path, monkeypatch, prefetch_on):
    monkeypatch.setenv(step_export.ENV, str(tmp_path))
    step_prefetch.set_prefetch(0)
    want = greedy_generate(runner(), PROMPTS, 5)  # "the last process": exports its steps and records them
    (record,) = tmp_path.glob("recent-*.json")
    entries = json.loads(record.read_text())
    assert entries and all((tmp_path / n).is_file() and set(placed) <= {"c", "u"} for n, placed, _ in entries)
    step_prefetch.set_prefetch(16)
    before = background_stats().programs
    ours = runner()  # starts loading the recorded steps on the worker thread
    exported = ours._exported
    assert exported is not None
    assert wait_for_loads(120)
    for name, _, _ in entries:
        assert exported._ahead._futures[name].result() not in (None, MISSING)  # every recorded step loaded ahead
    assert background_stats().programs - before >= len(entries)
    with CompileClock() as clock:
        assert greedy_generate(ours, PROMPTS, 5) == want
    assert clock.stats.programs == 0  # the caller reused what the worker compiled


def gated_loader(blocker: str, loads: list[str], result=lambda name: name):
    """``load(name)`` recording what it loaded; loading ``blocker`` sets ``started`` and waits for ``gate``; "bad"
    fails. Returns (load, started, gate)."""
    started, gate = threading.Event(), threading.Event()

    def load(name: str):
        if name == blocker:
            started.set()
            gate.wait(30)
        if name == "bad":
            raise ValueError("corrupt")
        loads.append(name)
        return result(name)

    return load, started, gate


def test_each_program_is_loaded_once_by_whoever_starts_it():
    loads: list[str] = []
    load, started, gate = gated_loader("slow", loads, lambda name: f"program {name}")

    ahead = AheadLoader()
    ahead.start([("slow", 0.0), ("later", 1.0), ("bad", 2.0)], load)
    assert started.wait(30)
    assert ahead.take("later") is MISSING  # the worker is still on "slow": the caller loads "later" itself
    got: list = []
    taker = threading.Thread(target=lambda: got.append(ahead.take("slow")))
    taker.start()
    while "slow" in ahead._futures:  # handed over while the worker is still loading it
        time.sleep(0.01)
    gate.set()
    taker.join(30)
    assert got == ["program slow"]  # the caller waited for the worker
    assert ahead.take("bad") is None  # the worker's load failed: the caller loads it and reports the failure
    assert ahead.take("never queued") is MISSING
    assert loads == ["slow"]  # "later" was left to its caller, never loaded twice
    assert ahead.take("slow") is MISSING  # handed over once: the loader keeps no reference to it


def test_a_handed_over_program_is_freed_with_its_caller():
    class Program:
        pass

    loads: list[str] = []
    load, _, gate = gated_loader("none", loads, lambda name: Program())
    ahead = AheadLoader()
    ahead.start([("p", 0.0)], load)
    assert wait_for_loads(30)
    program = weakref.ref(ahead.take("p"))
    gc.collect()
    assert program() is None  # nothing but the caller held it


def test_recent_steps_put_this_process_first_and_survive_a_bad_record(tmp_path):
    path = tmp_path / "recent.json"
    path.write_text("{not json")
    first = RecentSteps(path, keep=3)
    assert first.entries == []
    first.used("a", "uc")
    first.used("b", "u")
    first.used("a", "uc")
    assert [e[:2] for e in json.loads(path.read_text())] == [["a", "uc"], ["b", "u"]]
    at = [e[2] for e in first.entries]
    assert 0 <= at[0] <= at[1]  # seconds into the process, in order of first use
    path.write_text(json.dumps(json.loads(path.read_text()) + [["old format", "u"], [1, 2, 3]]))
    second = RecentSteps(path, keep=3)
    assert [e[0] for e in second.entries] == ["a", "b"]  # malformed rows are dropped
    second.used("c", "")
    second.used("b", "u")
    second.used("d", "c")
    assert [e[:2] for e in second.entries] == [("c", ""), ("b", "u"), ("d", "c"), ("a", "uc")]
    assert [e[0] for e in json.loads(path.read_text())] == ["c", "b", "d"]  # the newest ``keep``


def test_the_worker_loads_the_soonest_needed_first_whichever_model_asked_first():
    order: list[str] = []
    load, started, gate = gated_loader("blocker", order)

    first, second = AheadLoader(), AheadLoader()
    first.start([("blocker", -1.0)], load)
    assert started.wait(30)
    first.start([("verifier step", 9.0), ("verifier prefill", 5.0)], load)
    second.start([("drafter prefill", 1.0), ("drafter decode", 2.0)], load)  # registered later, needed sooner
    gate.set()
    assert wait_for_loads(30)
    assert order == ["blocker", "drafter prefill", "drafter decode", "verifier prefill", "verifier step"]


def test_a_bad_prefetch_setting_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("SPECRAG_PREFETCH_STEPS", "many")
    assert main(["generate", "--model", "tiny:llama", "--prompt", "hi", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "specrag: error: SPECRAG_PREFETCH_STEPS must be a number of programs (0: off), got 'many'"
    assert step_prefetch.prefetch_limit() == 0  # the command's setting ends with it
