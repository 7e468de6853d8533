"""Engine phases (drafting's rationale -> forced tag -> response): equal to ``Generator.generate_phases``,
branches move on independently, K/V is kept, failures stay with their own request and pages come home."""

from __future__ import annotations

import pytest

from specrag_jax.models.engine.requests import EngineError
from specrag_jax.models.generation import Generator, Phase
from tests.models.engine.conftest import assert_pages_home

PREFIX = list(range(10, 31))
SUFFIXES = [[40, 41], [42], [43, 44, 45]]
FORCED = [7, 8, 9]


def _between(keep_rule):
    def between(phase, row, res):
        return keep_rule(row, res), FORCED

    return between


@pytest.mark.parametrize("keep", ["none", "three", "all"])
def test_phases_equal_generator_phases(engine, tiny_model, keep):
    rule = {"none": lambda r, res: 0, "three": lambda r, res: 3, "all": lambda r, res: len(res.token_ids)}[keep]
    phases = [Phase(5), Phase(4)]
    want = Generator(tiny_model.runner, tiny_model.generator.eos_ids).generate_phases(
        PREFIX, SUFFIXES, phases, _between(rule)
    )
    before = engine.stats().get("prefill_tokens", 0)
    got = engine.submit_phases(PREFIX, SUFFIXES, phases, _between(rule)).result(60)
    assert len(got) == 2
    for p in range(2):
        assert [g.token_ids for g in got[p]] == [w.token_ids for w in want[p]]
        assert [g.finish_reason for g in got[p]] == [w.finish_reason for w in want[p]]
    # Phase 2 prefills only the forced tokens (+ the last kept token, never fed back), not the prompt again.
    first_prompts = sum(len(PREFIX) + len(s) for s in SUFFIXES)
    assert engine.stats()["prefill_tokens"] - before <= first_prompts + len(SUFFIXES) * (len(FORCED) + 1)
    assert_pages_home(engine)


def test_phases_under_concurrency_equal_alone(engine):
    phases = [Phase(6), Phase(3)]
    rule = _between(lambda r, res: min(2, len(res.token_ids)))
    groups = [(list(range(5 + i, 25 + i)), [[40 + i], [41, 42 + i]]) for i in range(6)]
    alone = [engine.submit_phases(p, s, phases, rule).result(60) for p, s in groups]
    reqs = [engine.submit_phases(p, s, phases, rule) for p, s in groups]
    together = [r.result(60) for r in reqs]
    ids = lambda out: [[g.token_ids for g in phase] for phase in out]  # noqa: E731
    assert [ids(o) for o in together] == [ids(o) for o in alone]
    assert_pages_home(engine)


def test_a_failing_transition_fails_only_its_request(engine):
    phases = [Phase(4), Phase(4)]

    def too_many(phase, row, res):
        return 0, [5] * 100  # more than the reserved forced tokens

    def broken(phase, row, res):
        raise RuntimeError("listener bug")

    ok = engine.submit_phases(PREFIX, SUFFIXES, phases, _between(lambda r, res: 1))
    bad = engine.submit_phases(PREFIX, SUFFIXES, phases, too_many, max_forced_tokens=8)
    bug = engine.submit_phases([3, 4, 5], [[6]], phases, broken)
    with pytest.raises(EngineError, match="reserved 8 forced tokens"):
        bad.result(60)
    with pytest.raises(EngineError, match="listener bug"):
        bug.result(60)
    assert len(ok.result(60)) == 2
    assert_pages_home(engine)


def test_phase_arguments_are_checked(engine):
    from specrag_jax.errors import SpecRagError

    with pytest.raises(SpecRagError, match="max_new_tokens >= 1"):
        engine.submit_phases(PREFIX, SUFFIXES, [Phase(0)])
    with pytest.raises(SpecRagError, match="max_forced_tokens"):
        engine.submit_phases(PREFIX, SUFFIXES, [Phase(2), Phase(2)], max_forced_tokens=-1)
