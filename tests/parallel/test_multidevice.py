"""Sharded == single device, on 8 host CPU devices (in a subprocess; see conftest.py)."""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.parallel.conftest import ROOT, run_json
from tests.xla_env import xla_flags


def test_eight_devices(multidevice):
    assert multidevice["devices"] == 8


def test_tiny_models_sharded_tokens_and_scores_match(multidevice):
    by_arch = {r["arch"]: r for r in multidevice["tiny"]}
    assert set(by_arch) == {"llama", "gemma3"}
    for r in by_arch.values():
        assert r["num_devices"] == 8
        assert r["tokens_equal"], r
        assert r["max_score_diff"] < 1e-4, r
    # Llama's 4 KV heads split over model=4 and its pages over data=2; Gemma 3's single KV head stays replicated.
    assert by_arch["llama"]["pool_sharding"] == "P('data', None, 'model')"
    assert by_arch["llama"]["replicated"] == []
    assert by_arch["gemma3"]["pool_sharding"] == "P()"
    assert all("kv_heads(1 over model=8)" in n for n in by_arch["gemma3"]["replicated"])


def test_pallas_kernels_under_shard_map_match(multidevice):
    rows = multidevice["pallas"]
    assert {(tuple(r["heads"]), r["decode"]) for r in rows} == {
        ((8, 4), False),
        ((8, 4), True),
        ((8, 1), False),
        ((8, 1), True),
    }
    for r in rows:
        assert r["split"] == ("kv" if r["heads"][1] == 4 else "q")
        assert r["max_diff"] < 1e-5, r
        assert r["out_sharding"] == "P(None, 'model')"


def test_sharded_dense_topk_equals_unsharded(multidevice):
    r = multidevice["dense"]
    assert r["shards"] == 8
    assert r["ids_equal"]
    assert r["max_score_diff"] < 1e-5
    assert r["tie_order"] == [7, 500]


def test_drafter_and_verifier_on_disjoint_submeshes_run_concurrently(multidevice):
    r = multidevice["submeshes"]
    assert r["disjoint"]
    assert r["drafter_devices"] == [0, 1] and r["verifier_devices"] == [2, 3, 4, 5, 6, 7]
    assert r["drafter_params_on"] == [0, 1] and r["verifier_pool_on"] == [2, 3, 4, 5, 6, 7]
    assert r["same_as_sequential"]
    assert r["overlap_s"] > 0


def test_sharded_steps_compile_to_tensor_parallel_collectives(multidevice):
    r = multidevice["collectives"]
    for step in ("tree_score", "decode"):
        c = r[step]
        # One all-reduce after each layer's attention output and MLP down projection, a few for the vocabulary.
        assert 2 * r["layers"] <= c["all-reduce"]["count"] <= 2 * r["layers"] + 4, c
        assert c["all-to-all"]["count"] == 0 and c["reduce-scatter"]["count"] == 0, c
        # Nothing close to the output table is ever moved (a vocab-sharded table gathered = a regression).
        assert c["total"]["bytes"] < r["table_bytes"], c


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_sharded_forward_matches_single_process():
    import os

    from specrag_jax.parallel.distributed import sharded_forward_logits

    port = _free_port()
    env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2"), "JAX_PLATFORMS": "cpu"}
    cmd = [
        sys.executable,
        "-m",
        "specrag_jax.parallel.distributed",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
        "--mesh",
        "data=2,model=2",
    ]
    procs = [
        subprocess.Popen(
            cmd + ["--process-id", str(i)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    import json

    result = json.loads([ln for ln in outs[0][0].splitlines() if ln.startswith("{")][-1])
    assert (result["process_count"], result["devices"], result["local_devices"]) == (2, 4, 2)
    want = sharded_forward_logits(None)
    np.testing.assert_allclose(np.asarray(result["logits"]), want, atol=1e-4)


@pytest.fixture(scope="module")
def slow_checks() -> dict:
    return run_json(["-m", "specrag_jax.parallel.checks", "gemma", "pallas_model"])


@pytest.mark.slow
def test_gemma3_270m_sharded_matches_single_device(slow_checks):
    r = slow_checks["gemma"]
    assert r["num_devices"] == 8 and r["spec"] == "data=2,model=4"
    assert r["tokens_equal"], r
    assert r["max_score_diff"] < 1e-4, r
    assert r["replicated"] == [
        "layers_*/attn/k/kernel:kv_heads(1 over model=4)",
        "layers_*/attn/v/kernel:kv_heads(1 over model=4)",
    ]


@pytest.mark.slow
def test_whole_model_with_pallas_attention_sharded_matches(slow_checks):
    r = slow_checks["pallas_model"]
    assert r["impl"] == "pallas" and r["num_devices"] == 4
    assert r["tokens_equal"], r
    assert r["max_score_diff"] < 1e-4, r
    # Once the Decoder carries attention_mesh, each of the 2 layers runs its kernel under shard_map.
    assert r["shard_map_layers"] == (2 if r["hook"] else 0)
