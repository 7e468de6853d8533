"""Streaming loads in fresh processes: 8 host devices each receive only their part; peak RSS stays bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.load_memory import big_config, measure
from benchmarks.synthetic_hf import llama_config, write_checkpoint
from tests.xla_env import xla_flags

ROOT = Path(__file__).resolve().parents[3]
MB = 1024 * 1024

# Runs with 8 host devices. Every host->device transfer is logged (jax.device_put of a numpy array), per device.
CHILD = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.sharding import NamedSharding
    from specrag_jax.models.loading import streaming
    from specrag_jax.models.loading.hf_loader import load_hf
    from specrag_jax.models.loading.load import last_load_info, load_model_params
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.models.loading.params import flatten_tree
    from specrag_jax.parallel import Placement
    from tokenizers import Tokenizer, models, pre_tokenizers

    real_put, sent = jax.device_put, {}
    def spy(x, device=None, *args, **kwargs):
        if isinstance(x, np.ndarray):
            for d in ([device] if isinstance(device, jax.Device) else device.device_set if device else [None]):
                sent[d] = sent.get(d, 0) + x.nbytes
        return real_put(x, device, *args, **kwargs)
    jax.device_put = spy
    streaming.CHUNK_BYTES = 512  # leaves and shards written in many in-place chunks

    path = sys.argv[1]
    placement = Placement.from_spec("data=2,model=4")
    cfg, ref = load_hf(path)
    ref = flatten_tree(ref)
    report = {"devices": len(jax.devices())}
    for run in ("hf", "cache_miss", "cache_hit"):
        sent.clear()
        cfg, params = load_model_params(path, cache=run != "hf", shardings=placement.param_shardings)
        assert last_load_info().from_cache == (run == "cache_hit"), run
        want = flatten_tree(placement.param_shardings(cfg, params))
        own = {d: 0 for d in jax.devices()}
        for name, a in flatten_tree(params).items():
            assert isinstance(a.sharding, NamedSharding) and a.sharding.spec == want[name].spec, name
            for shard in a.addressable_shards:
                assert shard.data.shape == a.sharding.shard_shape(a.shape), name
                assert np.array_equal(np.asarray(shard.data), ref[name][shard.index]), name
                own[shard.device] += shard.data.nbytes
        report[run] = {"sent_equals_own": {str(d): sent.get(d, 0) == n for d, n in own.items()},
                       "sent_elsewhere": sent.get(None, 0), "own_bytes": sorted(set(own.values())),
                       "specs": {k: str(v.sharding.spec) for k, v in flatten_tree(params).items()}}
    # The real path: TextModel.load with a placement loads straight into its shardings.
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(96)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(path + "/tokenizer.json")
    sent.clear()
    sharded = TextModel.load(path, max_seq_len=64, cache=False, placement=placement)
    report["text_model_sent_equals_own"] = all(sent.get(d, 0) == n for d, n in own.items())
    single = TextModel.load(path, max_seq_len=64, cache=False)
    outs = [m.generate_ids([[5, 6, 7]], max_new_tokens=4)[0].token_ids for m in (single, sharded)]
    report["text_model_tokens_equal"] = outs[0] == outs[1]
    print(json.dumps(report))
""")


def test_sharded_load_over_8_devices_puts_only_each_devices_part(tmp_path):
    raw = llama_config(num_attention_heads=8, num_key_value_heads=2, head_dim=8, hidden_size=64)
    write_checkpoint(tmp_path / "hf", raw, shard_bytes=40_000)
    env = {
        **os.environ,
        "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8"),
        "JAX_PLATFORMS": "cpu",
        "SPECRAG_CACHE_DIR": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "hf")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8 and report["text_model_tokens_equal"] and report["text_model_sent_equals_own"]
    for run in ("hf", "cache_miss", "cache_hit"):
        r = report[run]
        assert all(r["sent_equals_own"].values()) and r["sent_elsewhere"] == 0, (run, r)
        assert len(r["own_bytes"]) == 1, r  # data=2 x model=4: every device holds the same share
        # split over "model": heads, MLP, vocabulary; 2 KV heads do not divide by 4 (replicated), nor norms
        assert r["specs"]["layers/attn/q/kernel"] == "P(None, 'model')", r["specs"]  # kernels [out, in]
        assert r["specs"]["layers/mlp/down/kernel"] == "P(None, None, 'model')", r["specs"]
        assert r["specs"]["embed/embedding"] == "P('model',)", r["specs"]
        assert r["specs"]["layers/attn/k/kernel"] == "P()", r["specs"]


def test_peak_rss_of_a_1gb_streamed_load_stays_below_size_plus_two_largest_tensors(tmp_path):
    """A float32 checkpoint loaded as float32 on CPU, where the loaded arrays are host memory themselves, so the
    model accounts for about the checkpoint size; the rest of the bound (2 x the largest tensor) is what a
    loader may hold in flight. The streamed loader holds a few 4 MiB chunks; the old host-assembled one held
    every shard's mapped pages plus a whole stacked leaf (benchmarks/results/load_memory.json)."""
    sizes = write_checkpoint(tmp_path / "ckpt", big_config(3, 2048, 16384, 8192), shard_bytes=512 * MB)
    assert sizes["bytes"] >= 1 << 30 and sizes["shards"] >= 2
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    bound = (sizes["bytes"] + 2 * sizes["largest_tensor_bytes"]) / MB
    row = measure("hf_new", tmp_path / "ckpt", tmp_path / "cache", timeout=900)
    assert row["param_bytes"] >= sizes["bytes"] - MB
    assert row["peak_minus_before_mb"] < bound, (row, bound)
