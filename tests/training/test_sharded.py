"""The train step on 8 host devices (data=4 x model=2, in a subprocess) equals the single-device step."""

from __future__ import annotations

from tests.parallel.conftest import run_json


def test_sharded_train_step_equals_single_device():
    result = run_json(["-m", "specrag_jax.training.sharded_check"], devices=8)
    assert result["devices"] == 8
    by_mode = {r["mode"]: r for r in result["checks"]}
    assert set(by_mode) == {"lora", "full"}
    for r in by_mode.values():
        assert len(r["sharded"]) == 4 and r["max_loss_diff"] < 1e-5 and r["max_param_diff"] < 1e-5, r
        assert r["programs"] == 1  # the donated state keeps its layout: no recompilation between steps
        assert r["batch_sharding"] == "P('data',)"  # rows split over the data axis
        assert r["base_up_kernel"] == "P('model',)" and r["devices"] == 8  # weights per the logical rules ([out, in])
    assert by_mode["lora"]["trainable_up"] == "P()"  # adapters replicated
    assert by_mode["full"]["trainable_up"] == "P('model',)"  # fully trained weights keep the base layout
