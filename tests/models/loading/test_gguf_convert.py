"""GGUF -> parameter tree / cache file: equal to the old gguf-py path, bit for bit, and safe to interrupt."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import gguf
import jax
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading import load as loading
from specrag_jax.models.loading.gguf_header import GGUFFile
from specrag_jax.models.loading.gguf_loader import convert_gguf_file, gguf_config, load_gguf
from specrag_jax.models.loading.gguf_plan import GGUF_NAMES, names_for, plan_leaves, reverse_permute_qk, run_jobs
from specrag_jax.models.loading.load import last_load_info, load_model_params
from specrag_jax.models.loading.param_file import save_tree
from specrag_jax.models.loading.params import assemble_params, flatten_tree
from specrag_jax.models.loading.registry import resolve_model_path
from specrag_jax.models.loading.weights_cache import PARAMS_FILE

TYPES = [QT.Q4_K, QT.Q6_K, QT.Q5_K, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.F16, QT.BF16, QT.F32]


def synthetic_gguf(path: Path, arch: str = "llama", experts: int = 0, stacked: bool = True) -> Path:
    """A 2-layer model (hidden 256: whole K-quant blocks) whose matrices cycle through every supported type,
    with random bytes (so NaN/inf scales too); norms and biases F32."""
    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("synthetic")
    meta = dict(
        block_count=2,
        context_length=64,
        embedding_length=256,
        feed_forward_length=512,
        head_count=4,
        head_count_kv=2,
        layer_norm_rms_eps=1e-5,
    )
    if experts:
        meta.update(expert_count=experts, expert_used_count=2)
    for key, value in meta.items():
        getattr(writer, f"add_{key}")(value)
    kinds = iter(TYPES * 20)

    def matrix(name: str, *shape: int) -> None:  # numpy shape [..., out, in]
        qtype = next(kinds)
        if qtype == QT.F32:
            writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
            return
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // block * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)

    matrix("token_embd.weight", 64, 256)
    matrix("output.weight", 64, 256)
    writer.add_tensor("output_norm.weight", rng.standard_normal(256).astype(np.float32))
    for i in range(2):
        for name, shape in (
            ("attn_q", (256, 256)),
            ("attn_k", (128, 256)),
            ("attn_v", (128, 256)),
            ("attn_output", (256, 256)),
        ):
            matrix(f"blk.{i}.{name}.weight", *shape)
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{name}.weight", rng.standard_normal(256).astype(np.float32))
        if arch == "qwen2":
            for name, n in (("attn_q", 256), ("attn_k", 128), ("attn_v", 128)):
                writer.add_tensor(f"blk.{i}.{name}.bias", rng.standard_normal(n).astype(np.float32))
        ffn = {"gate": (512, 256), "up": (512, 256), "down": (256, 512)}
        if not experts:
            for name, shape in ffn.items():
                matrix(f"blk.{i}.ffn_{name}.weight", *shape)
            continue
        writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", rng.standard_normal((experts, 256)).astype(np.float32))
        for name, shape in ffn.items():
            if stacked:
                matrix(f"blk.{i}.ffn_{name}_exps.weight", experts, *shape)
            for j in range(0 if stacked else experts):
                matrix(f"blk.{i}.ffn_{name}.{j}.weight", *shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def old_path_params(path: Path) -> dict:
    """The loader before this change: gguf-py's reader and ``dequantize``, ``assemble_params``'s transposes."""
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    cfg = gguf_config(GGUFFile(path), path)
    heads = {"layers/attn/q/kernel": cfg.num_heads, "layers/attn/k/kernel": cfg.num_kv_heads}

    def fetch(name: str, leaf: str) -> np.ndarray:
        t = tensors[name]
        with np.errstate(all="ignore"):
            w = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
        return reverse_permute_qk(w, heads[leaf]) if cfg.arch in ("llama", "mixtral") and leaf in heads else w

    return assemble_params(cfg, names_for(cfg, GGUFFile(path)), fetch)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(
    "arch,experts,stacked",
    [("llama", 0, True), ("qwen2", 0, True), ("llama", 3, True), ("llama", 3, False)],
    ids=["llama", "qwen2", "mixtral-exps", "mixtral-per-expert"],
)
def test_new_conversion_equals_old_bit_for_bit(tmp_path, arch, experts, stacked):
    path = synthetic_gguf(tmp_path / "s.gguf", arch, experts, stacked)
    want = flatten_tree(old_path_params(path))
    with np.errstate(all="ignore"):
        cfg, got = load_gguf(path)
        convert_gguf_file(path, "float32", tmp_path / "new.safetensors")
        convert_gguf_file(path, "bfloat16", tmp_path / "new16.safetensors")
    assert cfg.num_experts == experts and set(flatten_tree(got)) == set(want)
    assert all(same_bits(flatten_tree(got)[k], want[k]) for k in want)
    save_tree(tmp_path / "old.safetensors", want)
    assert (tmp_path / "new.safetensors").read_bytes() == (tmp_path / "old.safetensors").read_bytes()
    with np.errstate(invalid="ignore"):
        save_tree(tmp_path / "old16.safetensors", {k: v.astype(jax.numpy.bfloat16) for k, v in want.items()})
    assert (tmp_path / "new16.safetensors").read_bytes() == (tmp_path / "old16.safetensors").read_bytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_is_built_in_place_then_hit(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    path = synthetic_gguf(tmp_path / "s.gguf")
    with np.errstate(all="ignore"):
        _, want = load_model_params(str(path), dtype=dtype, cache=False)  # in memory, cast per leaf
        _, first = load_model_params(str(path), dtype=dtype)
    assert not last_load_info().from_cache
    _, second = load_model_params(str(path), dtype=dtype)
    assert last_load_info().from_cache
    for tree in (first, second):
        assert all(same_bits(a, b) for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(want)))
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [Path(last_load_info().cache_entry).name]


@pytest.mark.parametrize(
    "failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()], ids=["disk-full", "interrupted"]
)
def test_half_written_entry_is_never_used(tmp_path, monkeypatch, failure):
    """A conversion that dies halfway leaves no entry (a full disk: the load still succeeds, in memory)."""
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    path = synthetic_gguf(tmp_path / "s.gguf")
    real = loading.convert_gguf_file

    def dies_halfway(source, dtype, out):
        real(source, dtype, out)
        with open(out, "r+b") as fh:
            fh.truncate(os.path.getsize(out) // 2)
        raise failure

    monkeypatch.setattr(loading, "convert_gguf_file", dies_halfway)
    with np.errstate(all="ignore"):
        if isinstance(failure, OSError):
            with pytest.warns(UserWarning, match="could not write parameter cache"):
                _, params = load_model_params(str(path))
            assert all(same_bits(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(load_gguf(path)[1])))
        else:
            with pytest.raises(KeyboardInterrupt):
                load_model_params(str(path))
    assert list((tmp_path / "cache").iterdir()) == []  # no entry, no temporary directory
    monkeypatch.setattr(loading, "convert_gguf_file", real)
    with np.errstate(all="ignore"):
        load_model_params(str(path))
    entry = Path(last_load_info().cache_entry)
    assert not last_load_info().from_cache and (entry / "params" / PARAMS_FILE).is_file()


def test_header_matches_gguf_py(tmp_path):
    path = synthetic_gguf(tmp_path / "s.gguf", "qwen2")
    ours, theirs = GGUFFile(path, keep=lambda key: True), gguf.GGUFReader(str(path))
    fields = {key: f for key, f in theirs.fields.items() if not key.startswith("GGUF.")}  # its file-header entries
    assert set(ours.fields) == set(fields)
    for key, field in fields.items():
        assert ours.fields[key] == field.contents(), key
    for mine, t in zip(ours.tensors, theirs.tensors):
        assert (mine.name, mine.shape, mine.tensor_type, mine.offset, mine.n_bytes) == (
            t.name,
            tuple(int(d) for d in t.shape),
            t.tensor_type,
            t.data_offset,
            t.n_bytes,
        )
        assert ours.raw(mine).tobytes() == np.asarray(t.data).tobytes()


def test_lazy_string_array_and_bad_headers(tmp_path):
    path = resolve_model_path("smollm2-135m-instruct")
    tokens = GGUFFile(path).fields["tokenizer.ggml.tokens"]
    full = GGUFFile(path, keep=lambda key: key == "tokenizer.ggml.tokens").fields["tokenizer.ggml.tokens"]
    assert len(tokens) == len(full) == 49152 and [tokens[i] for i in (0, 1, 49151)] == [full[0], full[1], full[-1]]
    with pytest.raises(IndexError):
        tokens[49152]
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(16))
    for name, words in (("empty.gguf", "it is empty"), ("v9.gguf", "GGUF version 9")):
        with pytest.raises(SpecRagError, match=words) as err:
            GGUFFile(tmp_path / name)
        assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model", ["smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"]
)
def test_real_files_equal_the_old_conversion(model):
    """Leaves of the real files (SmolLM2: Q4_1, Q/K rows permuted; Gemma: Q5_0, Q8_0, Q4_K, Q6_K; Qwen: Q4_K,
    Q6_K, biases) equal gguf-py's dequantisation, transposed and stacked as the old loader did; only these
    leaves are converted the old way (benchmarks/convert_gguf.py compares whole files by sha256)."""
    path = resolve_model_path(model)
    header = GGUFFile(path)
    cfg = gguf_config(header, path)
    tensors = {t.name: t for t in header.tensors}
    heads = {"layers/attn/q/kernel": cfg.num_heads, "layers/attn/k/kernel": cfg.num_kv_heads}

    def old(leaf: str, name: str) -> np.ndarray:
        t = tensors[name]
        w = np.asarray(dequantize(header.raw(t), t.tensor_type), dtype=np.float32)
        w = reverse_permute_qk(w, heads[leaf]) if cfg.arch == "llama" and leaf in heads else w
        return w  # kernels are [out, in] as stored

    leaves = ["embed/embedding", "layers/attn/q/kernel", "layers/attn/k/kernel", "layers/mlp/down/kernel"]
    leaves += ["layers/attn/q/bias"] if cfg.attention_bias else []
    plan, layers = plan_leaves(cfg, header), (0, cfg.num_layers - 1)
    for leaf in leaves:
        template, (shape, jobs) = GGUF_NAMES[leaf], plan[leaf]
        if leaf.startswith("layers/"):  # the first and the last layer only, through the same fill code
            want = np.stack([old(leaf, template.format(i=i)) for i in layers])
            jobs = [dataclasses.replace(j, slot=(layers.index(j.slot[0]),)) for j in jobs if j.slot[0] in layers]
            shape = (2, *shape[1:])
        else:
            want = old(leaf, template)
        mine = np.empty(shape, np.float32)
        run_jobs(header, [(job, mine) for job in jobs])
        assert same_bits(mine, want), leaf
