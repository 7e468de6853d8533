"""benchmarks/tau_min_split.py: tau_min chosen on one split, measured on the other, from eval predictions."""

from __future__ import annotations

import json

from benchmarks.tau_min_split import apply, choose_tau, main, questions


def write(tmp_path, rows):
    path = tmp_path / "predictions.jsonl"
    lines = []
    for i, (spec_ok, conf, std_ok, consensus) in enumerate(rows):
        lines.append(
            {
                "method": "speculative",
                "question_id": f"q{i}",
                "data_source": "s",
                "correct": spec_ok,
                "latency_s": 2.0,
                "confidence": conf,
                "consensus": consensus,
            }
        )
        lines.append(
            {"method": "standard", "question_id": f"q{i}", "data_source": "s", "correct": std_ok, "latency_s": 5.0}
        )
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_fallback_below_the_floor_takes_the_standard_answer(tmp_path):
    # low confidence: speculative wrong, standard right; high: speculative right; consensus never falls back
    rows = questions(
        write(
            tmp_path,
            [
                (False, 0.1, True, False),
                (True, 0.8, False, False),
                (False, None, True, True),
                (False, 0.2, True, False),
            ],
        )
    )
    assert apply(rows, None) == {
        "n": 4,
        "accuracy": 0.25,
        "latency_mean_s": 2.0,
        "latency_median_s": 2.0,
        "fallbacks": 0,
    }
    tau = choose_tau(rows)
    assert 0.2 < tau < 0.8  # both low-confidence questions fall back, the confident one does not
    res = apply(rows, tau)
    assert res["fallbacks"] == 2 and res["accuracy"] == 0.75 and res["latency_mean_s"] == (2 * 7 + 2 * 2) / 4


def test_cli_writes_both_splits(tmp_path, capsys):
    path = write(tmp_path, [(False, 0.1, True, False), (True, 0.9, True, False)] * 3)
    out = tmp_path / "tau.json"
    assert main(["--predictions", str(path), "--tune", "4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["tune"]["questions"] == 4 and res["test"]["questions"] == 2
    assert res["test"]["with_fallback"]["accuracy"] == 1.0 and res["test"]["speculative"]["accuracy"] == 0.5
