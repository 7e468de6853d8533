"""Streaming loads: Hugging Face shards and the params cache read block by block into device parameters.

Bit-identical to the host-assembled loader, chunked in place, one-line errors for bad checkpoints. The
8-device sharded load and the peak-RSS measurement run in subprocesses (test_streaming_memory.py).
"""

from __future__ import annotations

import json

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file, save_file

from benchmarks.synthetic_hf import llama_config, write_checkpoint
from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading import hf_streaming, streaming
from specrag_jax.models.loading.hf_loader import load_hf
from specrag_jax.models.loading.hf_streaming import load_hf_streaming
from specrag_jax.models.loading.load import last_load_info, load_model_params, to_jax_leaf
from specrag_jax.models.loading.params import flatten_tree
from specrag_jax.models.loading.streaming import chunk_slices, place

CONFIGS = {
    "llama": llama_config(),
    "llama-tied": llama_config(tie_word_embeddings=True),
    "gemma3": llama_config(
        model_type="gemma3_text",
        sliding_window=8,
        query_pre_attn_scalar=8,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True,
    ),
    "qwen2": llama_config(model_type="qwen2"),
    "qwen3": llama_config(model_type="qwen3"),
    "mistral": llama_config(model_type="mistral", sliding_window=8),
    "mixtral": llama_config(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
}


def bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def assert_bitwise(old: dict, new: dict) -> None:
    fo, fn = flatten_tree(old), flatten_tree(new)
    assert list(fo) == list(fn)
    for name in fo:
        assert fo[name].dtype == fn[name].dtype and fo[name].shape == fn[name].shape, name
        assert np.array_equal(bits(fo[name]), bits(fn[name])), name


@pytest.mark.parametrize("src", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", [*CONFIGS, "mixtral-fused"])
def test_streamed_load_equals_host_assembled_bitwise(tmp_path, monkeypatch, arch, src):
    raw = CONFIGS[arch.removesuffix("-fused")]
    write_checkpoint(tmp_path / "hf", raw, dtype=src, shard_bytes=16_000, fused_experts=arch.endswith("fused"))
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 700)  # many chunks per leaf, layers split inside
    for dtype in ("float32", "bfloat16"):
        _, old = load_hf(tmp_path / "hf", to_jax_leaf(dtype))
        _, new = load_hf_streaming(tmp_path / "hf", dtype)
        assert_bitwise(old, new)
        assert not any(a.committed for a in jax.tree.leaves(new))  # as device_put of a host array


def test_load_model_params_streams_and_caches_the_same_bits(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 1000)
    write_checkpoint(tmp_path / "hf", CONFIGS["gemma3"], shard_bytes=30_000)
    _, old = load_hf(tmp_path / "hf", to_jax_leaf("bfloat16"))
    _, fresh = load_model_params(str(tmp_path / "hf"), dtype="bfloat16")
    assert not last_load_info().from_cache
    _, cached = load_model_params(str(tmp_path / "hf"), dtype="bfloat16")
    assert last_load_info().from_cache
    assert_bitwise(old, fresh)
    assert_bitwise(old, cached)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=4), limit=st.integers(1, 300), data=st.data())
def test_chunks_tile_the_array_and_place_rebuilds_it(shape, limit, data):
    order = data.draw(st.permutations(range(len(shape))))
    seen = np.zeros(shape, np.int32)
    for index in chunk_slices(shape, 4, order, limit):
        seen[index] += 1
        assert np.prod([s.stop - s.start for s in index]) * 4 <= max(limit, 4)
    assert (seen == 1).all()
    src = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    old = streaming.CHUNK_BYTES
    streaming.CHUNK_BYTES = limit
    try:
        out = place(shape, ml_dtypes.bfloat16, None, lambda idx: src[idx], order)
    finally:
        streaming.CHUNK_BYTES = old
    assert np.array_equal(bits(out), bits(src.astype(ml_dtypes.bfloat16)))


def _one_line(err: pytest.ExceptionInfo, *words: str) -> str:
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_missing_shard_file_is_one_line_error(tmp_path):
    info = write_checkpoint(tmp_path / "hf", CONFIGS["llama"], shard_bytes=20_000)
    assert info["shards"] >= 3
    (tmp_path / "hf" / "part-00001.safetensors").unlink()
    with pytest.raises(SpecRagError) as err:
        load_model_params(str(tmp_path / "hf"), cache=False)
    _one_line(err, "missing shard file 'part-00001.safetensors'", "model.safetensors.index.json")


def test_missing_unexpected_and_misplaced_tensors_are_one_line_errors(tmp_path):
    raw = CONFIGS["qwen3"]
    extra = {"model.layers.1.mlp.gate_proj.bias": np.zeros(64, np.float32)}
    write_checkpoint(tmp_path / "extra", raw, extra=extra)
    with pytest.raises(SpecRagError) as err:
        load_model_params(str(tmp_path / "extra"), cache=False)
    _one_line(err, "unexpected tensor 'model.layers.1.mlp.gate_proj.bias'")
    # what transformers also skips: RoPE buffers of old exports, a tied model's stored head
    ignorable = {
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32),
        "lm_head.weight": np.zeros((96, 32), np.float32),
    }
    write_checkpoint(tmp_path / "ok", CONFIGS["llama-tied"], extra=ignorable)
    load_model_params(str(tmp_path / "ok"), cache=False)

    write_checkpoint(tmp_path / "missing", raw)
    state = load_file(tmp_path / "missing" / "model.safetensors")
    del state["model.layers.1.self_attn.k_norm.weight"]
    save_file(state, str(tmp_path / "missing" / "model.safetensors"))
    with pytest.raises(SpecRagError) as err:
        load_model_params(str(tmp_path / "missing"), cache=False)
    _one_line(err, "missing tensor 'model.layers.1.self_attn.k_norm.weight'")

    write_checkpoint(tmp_path / "index", raw, shard_bytes=20_000)
    index = tmp_path / "index" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    name = "model.layers.0.mlp.up_proj.weight"
    data["weight_map"][name] = (
        "part-00000.safetensors" if data["weight_map"][name] != "part-00000.safetensors" else "part-00001.safetensors"
    )
    index.write_text(json.dumps(data))
    with pytest.raises(SpecRagError) as err:
        load_model_params(str(tmp_path / "index"), cache=False)
    _one_line(err, repr(name), "where the index puts it")


def test_mismatched_shape_is_one_line_error_before_reading(tmp_path, monkeypatch):
    write_checkpoint(tmp_path / "hf", CONFIGS["mixtral"])
    state = load_file(tmp_path / "hf" / "model.safetensors")
    name = "model.layers.1.block_sparse_moe.experts.2.w1.weight"
    state[name] = state[name][:40]
    save_file(state, str(tmp_path / "hf" / "model.safetensors"))
    monkeypatch.setattr(hf_streaming, "place", lambda *a, **k: pytest.fail("read data before checking shapes"))
    with pytest.raises(SpecRagError) as err:
        load_hf_streaming(tmp_path / "hf")
    _one_line(err, repr(name), "(32, 40)", "expected (32, 64)")


def test_shardings_for_gguf_and_cache_hits_on_one_device(tmp_path, monkeypatch):
    from tests.models.loading.test_loading import write_gguf

    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("model",)), P())
    every = lambda cfg, tree: jax.tree.map(lambda _: sharding, tree)  # noqa: E731
    write_checkpoint(tmp_path / "hf", CONFIGS["qwen2"])
    for source in (str(write_gguf(tmp_path / "tiny.gguf")), str(tmp_path / "hf")):
        _, ref = load_model_params(source, cache=False)
        for cache in (False, True, True):
            _, params = load_model_params(source, cache=cache, shardings=every)
            assert all(a.sharding == sharding for a in jax.tree.leaves(params)), (source, cache)
            assert_bitwise(ref, params)
        assert last_load_info().from_cache


def test_a_failing_sharding_on_a_cache_hit_keeps_the_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    write_checkpoint(tmp_path / "hf", CONFIGS["qwen2"])
    load_model_params(str(tmp_path / "hf"))  # builds the entry
    entry = last_load_info().cache_entry

    def bad(cfg, tree):
        raise SpecRagError("mesh axis 'model' (3 devices) does not divide dimension 64")

    with pytest.raises(SpecRagError, match="does not divide") as err:
        load_model_params(str(tmp_path / "hf"), shardings=bad)
    assert len(str(err.value).splitlines()) == 1
    load_model_params(str(tmp_path / "hf"))
    assert last_load_info().from_cache and last_load_info().cache_entry == entry  # not deleted and rebuilt


@pytest.mark.parametrize(
    "entry",
    [
        {"shape": [2]},
        {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]},
        {"dtype": "F32", "shape": "x", "data_offsets": [0, 8]},
    ],
)
def test_malformed_header_entries_are_one_line_errors(tmp_path, entry):
    from specrag_jax.models.loading.param_file import read_header

    raw = json.dumps({"w": entry}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(16))
    with pytest.raises(SpecRagError, match="tensor w") as err:
        read_header(path)
    assert len(str(err.value).splitlines()) == 1
