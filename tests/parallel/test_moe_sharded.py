"""Sharded Mixtral on 8 host devices (subprocess: see conftest.py): tensor parallel inside experts (the default),
expert parallel and a data axis all equal the single-device run; the default's collectives stay those of a dense
tensor-parallel step (one all-reduce per attention and per MoE block, no all-to-all), expert parallel's do not."""

from __future__ import annotations

import pytest

from tests.parallel.conftest import run_json


@pytest.fixture(scope="module")
def moe() -> dict:
    return run_json(["-m", "specrag_jax.parallel.checks_moe"])


@pytest.mark.parametrize("layout", ["tp_in_experts", "expert_parallel", "tp_data"])
def test_sharded_moe_equals_single_device(moe, layout):
    r = moe[layout]
    assert moe["devices"] == 8 and r["num_devices"] == 8
    assert r["tokens_equal"], r
    assert r["max_score_diff"] < 1e-4, r
    assert r["specs"]["router/kernel"] == "P()"  # the router is replicated in every layout
    assert r["steps"]["decode"]["moe_impl"] == "gather" and r["steps"]["prefill"]["moe_impl"] == "ragged"


def test_expert_weight_specs(moe):
    tp, ep = moe["tp_in_experts"]["specs"], moe["expert_parallel"]["specs"]
    # Stacked [L, E, H, I] / [L, E, I, H]: the expert width splits (TP), or the expert axis (EP).
    assert tp["gate/kernel"] == tp["up/kernel"] == "P(None, None, None, 'model')"
    assert tp["down/kernel"] == "P(None, None, 'model')"
    assert ep["gate/kernel"] == ep["up/kernel"] == ep["down/kernel"] == "P(None, 'model')"


def test_moe_collectives(moe):
    layers = moe["layers"]
    for step in ("prefill", "tree_score", "decode"):
        tp = moe["tp_in_experts"]["steps"][step]["collectives"]
        assert 2 * layers <= tp["all-reduce"]["count"] <= 2 * layers + 4, tp
        assert "all-to-all" not in tp and "reduce-scatter" not in tp, tp
        ep = moe["expert_parallel"]["steps"][step]["collectives"]
        assert ep["total"]["bytes"] > tp["total"]["bytes"], (step, ep, tp)
