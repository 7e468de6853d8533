"""Mesh specs, device lists, axis rules and partition specs (one device; abstract meshes for shapes)."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels.sharded import head_split
from specrag_jax.models.config import param_shapes, tiny_config
from specrag_jax.models.executor.placement_api import StepPlacement
from specrag_jax.parallel import (
    Placement,
    make_mesh,
    param_specs,
    parse_device_list,
    parse_mesh_spec,
    pool_spec,
    split_devices,
)


def shapes(cfg):
    return jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s, "float32"), param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)
    )


def test_parse_mesh_spec():
    assert parse_mesh_spec("data=2,model=4") == {"data": 2, "model": 4}
    assert parse_mesh_spec(" 8 ") == {"model": 8}
    for bad, msg in [
        ("", "empty"),
        ("data=2,data=2", "twice"),
        ("data:2", "NAME=SIZE"),
        ("model=0", ">= 1"),
        ("model=x", "NAME=SIZE"),
    ]:
        with pytest.raises(SpecRagError, match=msg):
            parse_mesh_spec(bad)


def test_mesh_must_match_device_count():
    assert dict(make_mesh("model=1").shape) == {"model": 1}
    with pytest.raises(SpecRagError, match=r"mesh data=2,model=4 needs 8 devices but 1 are given"):
        make_mesh("data=2,model=4")
    with pytest.raises(SpecRagError, match="same device twice"):
        make_mesh("model=2", [jax.devices()[0]] * 2)


def test_device_lists_and_splits():
    assert parse_device_list("1") == jax.devices()[:1]
    assert parse_device_list("0-0") == jax.devices()[:1]  # a bare number is a count; indices use ranges/commas
    with pytest.raises(SpecRagError, match="asked for 0 devices"):
        parse_device_list("0")
    with pytest.raises(SpecRagError, match="asked for 3 devices but 1"):
        parse_device_list("3")
    with pytest.raises(SpecRagError, match="out of range"):
        parse_device_list("0,1")
    with pytest.raises(SpecRagError, match="bad device list"):
        parse_device_list("a-b")
    with pytest.raises(SpecRagError, match=r"need 8 devices but only 1"):
        split_devices(None, [2, 6])
    devs = list(range(8))
    assert split_devices(devs, [2, 6]) == [[0, 1], [2, 3, 4, 5, 6, 7]]


def test_gemma_specs_replicate_the_single_kv_head():
    cfg = tiny_config("gemma3", vocab_size=128, num_heads=8, num_kv_heads=1)
    mesh = AbstractMesh((2, 4), ("data", "model"))
    notes: list[str] = []
    specs = param_specs(cfg, shapes(cfg), mesh, replicated=notes)
    attn, mlp = specs["layers"]["attn"], specs["layers"]["mlp"]
    assert attn["q"]["kernel"] == P(None, "model")  # stacked layout: leading layers axis; kernels [out, in]
    assert attn["o"]["kernel"] == P(None, None, "model")
    assert attn["k"]["kernel"] == P() and attn["v"]["kernel"] == P()
    assert mlp["gate"]["kernel"] == P(None, "model") and mlp["down"]["kernel"] == P(None, None, "model")
    assert specs["embed"]["embedding"] == P("model")
    assert specs["layers"]["post_attn_norm"]["scale"] == P()
    assert any("kv_heads(1 over model=4)" in n for n in notes)
    assert pool_spec(cfg, 64, mesh) == P()


def test_llama_specs_split_kv_heads_and_untied_head():
    cfg = tiny_config("llama", vocab_size=100, num_heads=8, num_kv_heads=4, tie_embeddings=False)
    mesh = AbstractMesh((2, 4), ("data", "model"))
    notes: list[str] = []
    specs = param_specs(cfg, shapes(cfg), mesh, replicated=notes)
    assert specs["layers"]["attn"]["k"]["kernel"] == P(None, "model")
    assert specs["lm_head"]["kernel"] == P("model")  # [vocab, hidden]: 100 % 4 == 0
    assert pool_spec(cfg, 64, mesh) == P(None, None, "model")
    # model=8: 4 KV heads and a 100-entry vocabulary do not divide -> replicated, reported.
    notes = []
    specs8 = param_specs(cfg, shapes(cfg), AbstractMesh((8,), ("model",)), replicated=notes)
    assert specs8["layers"]["attn"]["k"]["kernel"] == P() and specs8["lm_head"]["kernel"] == P()
    assert specs8["layers"]["attn"]["q"]["kernel"] == P(None, "model")
    assert any(n.startswith("lm_head/kernel:vocab(100") for n in notes)


def test_strict_axis_that_cannot_divide_raises():
    cfg = tiny_config("llama")
    rules = {"pages": "data", "kv_heads": "model"}
    with pytest.raises(
        SpecRagError,
        match=r"kv_pool: pages dimension of size 63 cannot be divided over mesh "
        r"axes data=2",
    ):
        pool_spec(cfg, 63, AbstractMesh((2, 2), ("data", "model")), rules)
    assert pool_spec(cfg, 64, AbstractMesh((2, 2), ("data", "model")), rules) == P("data", None, "model")


def test_head_split_modes():
    assert head_split(8, 4, 4) == "kv"
    assert head_split(8, 1, 4) == "q"
    assert head_split(8, 2, 4) is None
    assert head_split(8, 4, 1) is None


def test_placement_implements_the_runner_protocol():
    """``models`` reaches a placement only through ``StepPlacement`` (it never imports ``parallel``)."""
    placement = Placement.from_spec("model=1")
    assert isinstance(placement, StepPlacement)
    x = placement.put(jax.numpy.arange(4), placement.replicated)
    assert x.sharding == placement.replicated and x.tolist() == [0, 1, 2, 3]
