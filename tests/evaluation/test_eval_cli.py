"""`specrag eval`: the public JSON contract on a two-question fixture, and its input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrag_jax.cli import main
from specrag_jax.models.speculative.tree import default_tree_budget
from specrag_jax.pipeline.selection import SELECTIONS
from tests.evaluation.conftest import SMOL_EVAL_METHODS

DATA = Path(__file__).parents[1] / "pipeline" / "data" / "mini_eval.jsonl"


@pytest.mark.slow
def test_eval_json_contract(smol_eval):
    assert smol_eval.code == 0, smol_eval.err
    out, tmp_path = smol_eval.out, smol_eval.out_dir
    res = json.loads(out)
    assert set(res) >= {"methods", "config"}
    assert list(res["methods"]) == SMOL_EVAL_METHODS  # the five compared methods, lossless and auto, in order
    for name in res["methods"]:
        m = res["methods"][name]
        assert m["n"] == 2 and 0.0 <= m["accuracy"] <= 1.0
        assert set(m["by_source"]) == {"toy", "toy2"}
        assert set(m["latency_s"]) == {"mean", "median", "p95"} and m["latency_s"]["mean"] > 0
        assert m["tokens"]["total"] > 0
        assert m["compile_s"] >= 0 and m["wall_s"]["mean"] >= m["latency_s"]["mean"]
    # drafter_only and random_draft reuse the speculative drafts: no verifier tokens, same drafter tokens.
    spec, dro = res["methods"]["speculative"]["tokens"], res["methods"]["drafter_only"]["tokens"]
    assert dro["drafter_decode_tokens"] == spec["drafter_decode_tokens"] > 0
    assert dro["verifier_tree_tokens"] == 0
    ablations = res["ablations"]
    assert {"draft+sc+sr/mean", "draft/sum", "sc+sr/mean", "oracle"} <= set(ablations)
    assert all(0.0 <= v <= ablations["oracle"] for k, v in ablations.items())
    assert res["drafts"]["n"] >= 2 and 0.0 <= res["drafts"]["follows_format"] <= res["drafts"]["parsed"] <= 1.0
    assert res["config"]["split"] == "all"
    assert res["config"]["m"] == 2 and res["config"]["offset"] == 0
    assert res["config"]["drafter_adapter"] == "smollm2-rag-drafter"  # the drafter's shipped default
    assert res["config"]["selection"] in SELECTIONS
    assert res["config"]["clustering"] == "lexical"  # the default: passages clustered by their words
    assert set(res["selection"]) == {*SELECTIONS, "oracle"}
    cascade = res["methods"]["speculative"]["cascade"]
    assert cascade["n"] == 2 and cascade["accepted"] + cascade["fallback"] == 2
    assert json.loads((tmp_path / "results.json").read_text())["methods"].keys() == res["methods"].keys()
    assert (tmp_path / "accuracy_vs_latency.png").stat().st_size > 0
    predictions = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2 * len(SMOL_EVAL_METHODS)
    assert all(1 <= len(p["drafts"]) <= 2 for p in predictions if p["method"] == "speculative")
    assert res["config"]["early_fallback"] is True
    router = res["methods"]["auto"]["router"]  # the router's paths, predictions and its predictor's calibration
    assert router["n"] == 2 and sum(router["paths"].values()) == 2 and router["predicted_s_mean"] > 0
    assert set(router["calibration"]) == {"accept", "accept_right", "accept_standard_right"}
    assert all(p["route"]["path"] in ("exact", "cascade") for p in predictions if p["method"] == "auto")
    for p in predictions:  # the passes eval ran after each speculative answer: never one the answer ran
        if p["method"] == "speculative":
            assert not set(p["stages_s"]) & set(p["scored_after_answer"])
            assert {"verification_s", "evidence_verification_s"} <= set(p["stages_s"]) | set(p["scored_after_answer"])


@pytest.mark.slow
def test_eval_json_carries_the_speculation_contract(smol_eval):
    """``specrag eval`` with standard and lossless among its methods (the same run as the contract test above)."""
    assert smol_eval.code == 0, smol_eval.err
    out, tmp_path = smol_eval.out, smol_eval.out_dir
    res = json.loads(out)
    lossless, standard = res["methods"]["lossless"], res["methods"]["standard"]
    assert set(lossless["speculation"]) >= {"steps", "accepted_tokens_per_step", "proposed_tokens_per_step"}
    assert lossless["speculation"]["steps"] >= 1 and lossless["accuracy"] == standard["accuracy"]
    assert "speculation" not in standard
    assert res["config"]["proposer"] == "both" and res["config"]["tree_budget"] == default_tree_budget()  # CPU: 8
    preds = [json.loads(x) for x in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    by = {(p["question_id"], p["method"]): p["answer"] for p in preds}
    assert all(by[(q, "lossless")] == by[(q, "standard")] for q in ("toy_1", "toy_2"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "/nonexistent.jsonl"], "evaluation data file does not exist"),
        (["--data", str(DATA), "--limit", "0"], "--limit must be >= 1"),
        (["--data", str(DATA), "--offset", "-1"], "--offset must be >= 0"),
        (["--data", str(DATA), "--offset", "100000"], "leaves no questions"),
        (["--data", str(DATA), "--split", "heldout", "--holdout-fraction", "0"], "leaves no questions"),
        (["--data", str(DATA), "--split", "train", "--holdout-fraction", "2"], "holdout-fraction must be in"),
        (["--data", str(DATA), "--m", "0"], "m (number of drafts) must be >= 1"),
        (["--data", str(DATA), "--terms", "draft,nope"], "score terms"),
        (["--data", str(DATA), "--selection", "vote"], "unknown selection 'vote'; choose one of rho, evidence"),
        (["--data", str(DATA), "--tau-min", "1.5"], "tau_min must be in [0, 1] (got 1.5)"),
        (["--data", str(DATA), "--tau-min", "high"], "--tau-min must be a number in [0, 1] or 'none'"),
        (["--data", str(DATA), "--max-seq-len", "8"], "--max-seq-len must be >= 64"),
        (["--data", str(DATA), "--drafter-adapter", "/nonexistent/adapter"], "adapter not found: /nonexistent/adapter"),
    ],
)
def test_eval_bad_input(capsys, args, message):
    assert main(["eval"] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
