"""benchmarks/drafting_steps.py: drafting's steps split into prefill, tag prefill, decode and host time, and the
decode-step fit against its bounds."""

import pytest

from benchmarks.drafting_steps import fit_decode, split_question


def step(decode, live, tokens, cached, s):
    return {"kind": "sample", "decode": decode, "live": live, "rows": 5, "tokens": tokens, "cached": cached, "s": s}


def test_steps_are_split_by_class_and_decode_steps_by_live_sequences():
    log = [
        step(False, 2, 512, 40, 0.8),  # prompt prefill
        step(False, 1, 100, 552, 0.2),
        step(True, 5, 5, 600, 0.05),
        step(True, 5, 5, 605, 0.05),
        step(True, 2, 2, 300, 0.04),
        step(False, 1, 4, 150, 0.06),  # a forced tag prefilled alone
    ]
    out = split_question(log, total_s=1.3)
    assert out["prefill"] == {"steps": 2, "tokens": 612, "s": pytest.approx(1.0)}
    assert out["tag_prefill"] == {"steps": 1, "s": pytest.approx(0.06)}
    assert out["decode"]["steps"] == 3 and out["decode"]["s"] == pytest.approx(0.14)
    assert out["decode"]["by_live_sequences"] == {2: {"steps": 1, "s": 0.04}, 5: {"steps": 2, "s": 0.1}}
    assert out["host_outside_steps_s"] == pytest.approx(0.1)


def test_fit_recovers_the_fixed_and_per_token_costs():
    steps = [step(True, 5, 5, c, 0.030 + 20e-6 * c) for c in (200, 600, 1000, 1400)]
    fit = fit_decode(steps, weight_bytes=0.5e9, kv_bytes_per_token=2e4, bytes_per_s=20e9)
    assert fit["fixed_ms"] == pytest.approx(30.0, rel=1e-6)
    assert fit["per_kv_token_us"] == pytest.approx(20.0, rel=1e-6)
    assert fit["weight_read_bound_ms"] == pytest.approx(25.0)
    assert fit["kv_read_bound_us_per_token"] == pytest.approx(1.0)
    assert fit["attention_share_at_mean"] == pytest.approx(0.016 / 0.046)
    assert fit["r2"] == pytest.approx(1.0)
