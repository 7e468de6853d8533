"""The router (method ``auto``): the acceptance predictor's fit and calibration, stage predictions at a platform's
peaks, the decision rule, the shipped calibration, and one-line errors for bad options."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.machine_peaks import MachinePeaks, device_peaks
from specrag_jax.models.executor.cost import ModelCost
from specrag_jax.pipeline.rag_config import RAGConfig
from specrag_jax.pipeline.route_predictor import (
    FEATURES,
    TARGETS,
    AcceptancePredictor,
    calibration,
    fit_logistic,
    route_features,
)
from specrag_jax.pipeline.router import (
    STAGES,
    PromptCounts,
    RouterCalibration,
    check_router,
    choose,
    load_calibration,
    predict_stages,
)

# Per-token constants of the default pair as loaded here (float32 weights): Qwen2.5-1.5B and SmolLM2-135M.
VERIFIER = ModelCost(1.31e9, 2.33e8, 6.17e9, 4.0 * 28 * 1536, 2.0 * 28 * 256 * 4)
DRAFTER = ModelCost(1.06e8, 2.83e7, 5.38e8, 4.0 * 30 * 576, 2.0 * 30 * 192 * 4)
THIS_CPU = MachinePeaks(200e9, 30e9, "measured")
TEN_PASSAGES = PromptCounts(prompt=400, drafter_prefix=60, drafter_evidence=90, verifier_prefix=50, drafts=5)
FORTY_PASSAGES = dataclasses.replace(TEN_PASSAGES, prompt=4600)
SURE = {"accept": 0.9, "accept_right": 0.6, "accept_standard_right": 0.5}
NEVER = {"accept": 0.05, "accept_right": 0.02, "accept_standard_right": 0.02}


def test_fit_logistic_recovers_a_known_model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 2))
    y = (rng.random(4000) < 1 / (1 + np.exp(-(1.5 * x[:, 0] - 0.5 * x[:, 1] + 0.3)))).astype(float)
    coef, b = fit_logistic(x, y, l2=0.0)
    assert np.allclose(coef, [1.5, -0.5], atol=0.15) and abs(b - 0.3) < 0.15


@settings(max_examples=25, deadline=None)
@given(st.integers(5, 60), st.integers(0, 2**31 - 1), st.floats(0.1, 10.0))
def test_a_fitted_predictor_is_calibrated_in_the_mean(n, seed, l2):
    """With an unpenalised intercept the mean prediction equals the training rate (the score equation), for any
    data, labels and penalty, including all-negative and all-positive labels (adversarial)."""
    rng = np.random.default_rng(seed)
    rows = [{f: float(v) for f, v in zip(FEATURES, rng.normal(size=len(FEATURES)))} for _ in range(n)]
    rows[0] = dict(rows[1])  # a repeated row, and a constant column below
    for r in rows:
        r["log_docs"] = 2.0
    labels = {t: list(rng.random(n) < p) for t, p in zip(TARGETS, (0.3, 0.0, 1.0))}
    pred = AcceptancePredictor.fit(rows, labels, l2)
    for t in TARGETS:
        mean = np.mean([pred.predict(r)[t] for r in rows])
        assert abs(mean - np.mean(labels[t])) < 2e-3, t
    assert AcceptancePredictor.from_dict(json.loads(json.dumps(pred.to_dict()))) == pred


def test_calibration_report_against_a_negative_control():
    rng = np.random.default_rng(1)
    p = rng.random(3000)
    y = rng.random(3000) < p
    good = calibration(p, y, bins=5)
    assert good["brier"] < good["brier_of_observed_rate"]
    assert all(abs(b["predicted"] - b["observed"]) < 0.05 for b in good["reliability"])
    bad = calibration(1 - p, y, bins=5)  # reversed probabilities: must be worse than the constant rate
    assert bad["brier"] > bad["brier_of_observed_rate"]
    with pytest.raises(SpecRagError):
        calibration([0.5], [True, False])


def test_route_features_follow_the_question_and_passages():
    docs = [{"title": "Paris", "text": "Paris is the capital of France."}, {"title": "", "text": "Cheese and wine."}]
    f = route_features("The capital of France?", docs)
    assert set(f) == set(FEATURES)
    assert f["coverage_max"] == 1.0 and 0 < f["coverage_mean"] < 1 and f["bm25_max"] > 0 and f["bm25_spread"] > 0
    off = route_features("Who painted the Mona Lisa?", docs)
    assert off["coverage_max"] == 0.0 and off["bm25_max"] == 0.0
    assert route_features("the of a", docs)["coverage_max"] == 0.0  # stop words only: no terms, no error


def _stages(peaks, counts=TEN_PASSAGES, platform="cpu"):
    cal = load_calibration()
    return predict_stages(counts, DRAFTER, VERIFIER, peaks, cal.ratios(platform), cal.workload)


def test_the_same_code_decides_by_the_platforms_peaks():
    """At a high acceptance the cascade pays on an H200 and a TPU v5e (an accepted draft skips the verifier's
    memory-bound decode) but not on this CPU, where drafting and verification alone cost more than the exact path."""
    cal = load_calibration()
    rate = cal.workload.verify_rate
    cpu = choose(_stages(THIS_CPU), SURE, rate)
    assert cpu.path == "exact" and cpu.break_even_accept > 1
    for name in ("h200", "tpu-v5e"):
        peaks = device_peaks(name)
        route = choose(_stages(peaks, platform="gpu"), SURE, rate, platform="gpu")
        assert route.path == "cascade", (name, route.reason)
        assert choose(_stages(peaks, platform="gpu"), NEVER, rate).path == "exact"  # drafts thrown away: exact
    assert _stages(THIS_CPU, FORTY_PASSAGES)["exact"] > 2.5 * _stages(THIS_CPU)["exact"]


def test_the_cascade_is_refused_when_it_is_expected_to_lose_accuracy():
    stages = _stages(device_peaks("h200"), platform="gpu")
    losing = {**SURE, "accept_right": 0.3}
    rate = load_calibration().workload.verify_rate
    assert choose(stages, losing, rate).path == "exact"
    assert choose(stages, losing, rate, max_loss=0.25).path == "cascade"
    faster = choose(stages, SURE, rate)
    gain = 1 - faster.predicted_s["cascade"] / faster.predicted_s["exact"]
    assert choose(stages, SURE, rate, margin=min(gain + 0.05, 0.99)).path == "exact"


def test_expected_latency_follows_the_acceptance():
    stages = {s: 1.0 for s in STAGES}
    low = choose(stages, {**SURE, "accept": 0.1}, 1.0).predicted_s["cascade"]
    high = choose(stages, {**SURE, "accept": 0.9}, 1.0).predicted_s["cascade"]
    assert low == pytest.approx(2.9) and high == pytest.approx(2.1)
    # drafting 1 + verification 1 + (1 - p) fallback 3 < exact 4 exactly when p > 1/3
    stages = {"exact": 4.0, "drafting": 1.0, "verification": 1.0, "fallback": 3.0}
    at = {p: choose(stages, {**SURE, "accept": p}, 1.0) for p in (0.3, 0.34, 0.5)}
    assert all(r.break_even_accept == pytest.approx(1 / 3) for r in at.values())
    assert [at[p].path for p in (0.3, 0.34)] == ["exact", "cascade"]
    within = choose(stages, {**SURE, "accept": 0.5}, 1.0, margin=0.2)  # 3.5 s is not 20% under 4 s
    assert within.path == "exact" and "margin" in within.reason and within.break_even_accept == pytest.approx(0.6)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"router_max_loss": -0.1}, "max_loss"),
        ({"router_max_loss": 1.5}, "max_loss"),
        ({"router_margin": 1.0}, "margin"),
        ({"router_margin": -0.5}, "margin"),
    ],
)
def test_out_of_range_router_options_are_one_line_errors(kw, message):
    with pytest.raises(SpecRagError) as err:
        RAGConfig(**kw).check()
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SpecRagError):
        check_router(kw.get("router_max_loss", 0.0), kw.get("router_margin", 0.0))


def test_the_shipped_calibration_reads_and_a_broken_one_is_a_one_line_error(tmp_path):
    cal = load_calibration()
    assert set(cal.ratios("cpu")) == set(STAGES) and cal.ratios("tpu") == cal.ratios("default")
    assert cal.source["split"] == "train"  # chosen on questions the held-out report never saw
    assert RouterCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))).workload == cal.workload
    broken = [{"stage_ratio": {}}]
    for path, value in (
        (("stage_ratio", "cpu", "exact"), 0.0),
        (("predictor", "mean"), [0.0]),
        (("workload", "verify_rate"), -1),
    ):
        d = json.loads(json.dumps(cal.to_dict()))
        node = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        broken.append(d)
    for i, d in enumerate(broken):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(json.dumps(d))
        with pytest.raises(SpecRagError) as err:
            load_calibration(str(bad))
        assert "router calibration" in str(err.value) and "\n" not in str(err.value), d


def test_answers_to_the_end_of_turn_are_predicted_longer_than_one_line():
    """ask's answers (to the end of turn) are costed at their own measured length, eval's at one line's: the answer
    stages (exact, fallback) cost more, drafting and verification the same."""
    from specrag_jax.pipeline.router import route_counts

    cal = load_calibration()
    w = cal.workload
    assert w.turn_answer_tokens > w.answer_tokens
    assert w.for_answers("turn").answer_tokens == w.turn_answer_tokens and w.for_answers("line") == w
    line, turn = (
        route_counts(TEN_PASSAGES, NEVER, DRAFTER, VERIFIER, THIS_CPU, "cpu", cal, answer_stop=form)
        for form in ("line", "turn")
    )
    assert turn.stages_s["exact"] > line.stages_s["exact"] and turn.stages_s["fallback"] > line.stages_s["fallback"]
    assert turn.stages_s["drafting"] == line.stages_s["drafting"]
