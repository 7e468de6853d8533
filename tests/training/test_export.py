"""`specrag export-adapter`: a run's adapters as adapter.safetensors + adapter.json, loaded like the run."""

from __future__ import annotations

import json

import jax
import ml_dtypes
import numpy as np
import pytest

from specrag_jax.adapters import resolve_adapter
from specrag_jax.cli import main
from specrag_jax.errors import SpecRagError
from specrag_jax.training import loop
from specrag_jax.training.export import ADAPTER_FILE, META_FILE, export_adapter
from specrag_jax.training.lora_merge import adapter_info, load_adapter
from tests.training.conftest import counting_examples, small_config


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    cfg, params = tiny
    out = tmp_path_factory.mktemp("run")
    loop.train(
        cfg,
        params,
        counting_examples(40),
        counting_examples(8, seed=1),
        small_config(optim=dict(steps=8), eval_every=4, save_every=4),
        out,
        base_name="tiny",
    )
    return out


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_float32_export_merges_bitwise_like_the_run(tiny, run, tmp_path):
    cfg, params = tiny
    dest = export_adapter(run, tmp_path / "a32", dtype="float32")
    from_run, meta_run = load_adapter(run, "tiny", cfg, params)
    from_export, meta = load_adapter(dest, "tiny", cfg, params)
    for a, b in zip(_leaves(from_run), _leaves(from_export)):
        np.testing.assert_array_equal(a, b)
    assert meta["step"] == meta_run["step"] == 8 and meta["dtype"] == "float32" and "history" not in meta
    assert adapter_info(dest)["base_model"] == "tiny"
    assert sorted(p.name for p in dest.iterdir()) == [META_FILE, ADAPTER_FILE]


def test_bfloat16_export_is_half_the_size_and_close(tiny, run, tmp_path):
    cfg, params = tiny
    a32 = export_adapter(run, tmp_path / "a32", dtype="float32")
    a16 = export_adapter(run, tmp_path / "a16")  # bfloat16 by default
    assert (a16 / ADAPTER_FILE).stat().st_size < 0.6 * (a32 / ADAPTER_FILE).stat().st_size
    exact, _ = load_adapter(a32, "tiny", cfg, params)
    rounded, _ = load_adapter(a16, "tiny", cfg, params)
    for a, b, base in zip(_leaves(exact), _leaves(rounded), _leaves(params)):
        assert a.dtype == b.dtype == base.dtype
        delta, approx = a.astype(np.float64) - base, b.astype(np.float64) - base  # the adapter's update
        bound = 4 * float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) * max(float(np.abs(delta).max()), 1e-6)
        np.testing.assert_allclose(approx, delta, atol=bound + 1e-6)


def test_refusals(tiny, run, tmp_path):
    cfg, params = tiny
    dest = export_adapter(run, tmp_path / "a")
    with pytest.raises(SpecRagError, match="already exists"):
        export_adapter(run, dest)
    with pytest.raises(SpecRagError, match="trained on base model 'tiny'.*not on 'other'"):
        load_adapter(dest, "other", cfg, jax.tree_util.tree_map(lambda x: x + 1, params))
    with pytest.raises(SpecRagError, match="adapter not found: no-such-adapter"):
        resolve_adapter("no-such-adapter")
    (dest / ADAPTER_FILE).unlink()
    with pytest.raises(SpecRagError, match="no adapter.safetensors"):
        load_adapter(dest, "tiny", cfg, params)


def test_a_failed_export_leaves_nothing(run, tmp_path, monkeypatch):
    from specrag_jax.training import export

    def broken(path, tree):
        open(path, "wb").write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(export, "save_tree", broken)
    with pytest.raises(OSError, match="disk full"):
        export_adapter(run, tmp_path / "a")
    assert list(tmp_path.iterdir()) == []  # neither the destination nor a temporary folder


def test_cli(run, tmp_path, capsys):
    assert main(["export-adapter", "--run", str(run), "--out", str(tmp_path / "x")]) == 0
    assert "bfloat16" in capsys.readouterr().out
    assert json.loads((tmp_path / "x" / META_FILE).read_text())["mode"] == "lora"
    assert main(["export-adapter", "--run", str(run), "--out", str(tmp_path / "x")]) == 2
    assert "already exists" in capsys.readouterr().err


def test_the_base_fingerprint_follows_the_weights_not_unused_config_fields(tiny):
    from specrag_jax.training.checkpoint import base_fingerprint

    cfg, params = tiny
    fp = base_fingerprint(cfg, params)
    assert base_fingerprint(cfg.replace(rope_local_theta=cfg.rope_local_theta * 10), params) == fp
    assert base_fingerprint(cfg, jax.tree_util.tree_map(lambda x: x * 1.5, params)) != fp


def test_the_base_fingerprint_hashes_kernels_in_their_former_in_out_order(tiny):
    """Adapters recorded their base's fingerprint while kernels were [in, out]: hashing today's [out, in]
    kernels must give what the old rule gave on the transposed tree (so shipped adapters still match)."""
    import hashlib

    from specrag_jax.models.decoder.transformer import stack_layers
    from specrag_jax.training.checkpoint import _SAMPLE, base_fingerprint

    cfg, params = tiny
    old_layout = jax.tree_util.tree_map_with_path(
        lambda path, a: np.swapaxes(np.asarray(a), -1, -2) if str(path[-1].key) == "kernel" else np.asarray(a),
        stack_layers(params, cfg.num_layers),
    )
    h = hashlib.sha256(f"fingerprint-2:{cfg.arch}".encode())  # the rule before cache format 3, verbatim
    for path, leaf in sorted(
        jax.tree_util.tree_flatten_with_path(old_layout)[0], key=lambda kv: jax.tree_util.keystr(kv[0])
    ):
        flat = leaf.reshape(-1)
        h.update(f"{jax.tree_util.keystr(path)}:{tuple(leaf.shape)}".encode())
        h.update(np.ascontiguousarray(flat[:: max(1, flat.size // _SAMPLE)].astype(ml_dtypes.bfloat16)).tobytes())
    assert base_fingerprint(cfg, params) == h.hexdigest()[:16]


def test_the_shipped_adapter_resolves_by_name_and_is_the_default_drafters():
    from specrag_jax.adapters import DEFAULT_ADAPTERS, KNOWN_ADAPTERS, default_adapter
    from specrag_jax.training.lora_merge import adapter_info

    folder = resolve_adapter("smollm2-rag-drafter")
    assert (folder / "adapter.safetensors").stat().st_size < 12e6  # tracked in the repository, package data
    info = adapter_info("smollm2-rag-drafter")
    assert info["base_model"] == "smollm2-135m-instruct" and info["mode"] == "lora" and info["dtype"] == "bfloat16"
    assert set(DEFAULT_ADAPTERS.values()) <= set(KNOWN_ADAPTERS)
    for name in KNOWN_ADAPTERS:  # every shipped adapter resolves, is package-sized and names its base and data
        assert (resolve_adapter(name) / "adapter.safetensors").stat().st_size < 12e6
        shipped = adapter_info(name)
        assert shipped["base_model"] == "smollm2-135m-instruct" and shipped["training_run"]["data_summary"]["split"]
    assert default_adapter("smollm2-135m-instruct", None) == "smollm2-rag-drafter"
    assert default_adapter("smollm2-135m-instruct", "none") is None
    assert default_adapter("gemma3-270m", None) is None
    assert default_adapter("gemma3-270m", "/some/run") == "/some/run"
