"""Model loading: GGUF and Hugging Face loaders, dequantisation, the Orbax cache and error messages."""

from __future__ import annotations

from pathlib import Path

import gguf
import jax
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import kernel_in_out, param_shapes
from specrag_jax.models.loading.gguf_loader import load_gguf
from specrag_jax.models.loading.hf_loader import load_hf
from specrag_jax.models.loading.load import last_load_info, load_model_params
from specrag_jax.models.loading.registry import resolve_model_path

MODELS = ["gemma3-270m", "smollm2-135m-instruct"]
# Our leaf -> Hugging Face state-dict name (written independently of the loaders' tables).
HF = {
    "embed/embedding": "model.embed_tokens.weight",
    "final_norm/scale": "model.norm.weight",
    "lm_head/kernel": "lm_head.weight",
    "layers/attn_norm/scale": "model.layers.{i}.input_layernorm.weight",
    "layers/attn/q/kernel": "model.layers.{i}.self_attn.q_proj.weight",
    "layers/attn/k/kernel": "model.layers.{i}.self_attn.k_proj.weight",
    "layers/attn/v/kernel": "model.layers.{i}.self_attn.v_proj.weight",
    "layers/attn/o/kernel": "model.layers.{i}.self_attn.o_proj.weight",
    "layers/attn/q_norm/scale": "model.layers.{i}.self_attn.q_norm.weight",
    "layers/attn/k_norm/scale": "model.layers.{i}.self_attn.k_norm.weight",
    "layers/mlp/gate/kernel": "model.layers.{i}.mlp.gate_proj.weight",
    "layers/mlp/up/kernel": "model.layers.{i}.mlp.up_proj.weight",
    "layers/mlp/down/kernel": "model.layers.{i}.mlp.down_proj.weight",
}
HF_NORMS = {
    "llama": {"layers/mlp_norm/scale": "model.layers.{i}.post_attention_layernorm.weight"},
    "gemma3": {
        "layers/post_attn_norm/scale": "model.layers.{i}.post_attention_layernorm.weight",
        "layers/mlp_norm/scale": "model.layers.{i}.pre_feedforward_layernorm.weight",
        "layers/post_mlp_norm/scale": "model.layers.{i}.post_feedforward_layernorm.weight",
    },
}


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def assert_matches_torch(cfg, params, state_dict, atol: float = 1e-6) -> None:
    """Every leaf equals the torch tensor(s) (kernels [out, in] as torch's; MoE ones transposed), Gemma norms
    compared as ours-1."""
    names = {**HF, **HF_NORMS[cfg.arch]}
    shapes = flat(param_shapes(cfg))
    ours = flat(params)
    assert set(ours) == set(shapes)
    for leaf, value in ours.items():
        value = np.asarray(value, dtype=np.float32)
        assert value.shape == tuple(shapes[leaf]), leaf
        if cfg.arch == "gemma3" and leaf.endswith("scale"):
            value = value - 1.0
        layers = range(cfg.num_layers) if leaf.startswith("layers/") else [None]
        theirs = np.stack([state_dict[names[leaf].format(i=i)].detach().float().numpy() for i in layers])
        mine = value if leaf.startswith("layers/") else value[None]
        mine = mine.swapaxes(1, 2) if kernel_in_out(leaf, cfg) else mine
        diff = float(np.abs(mine - theirs).max())
        assert diff <= atol, f"{leaf}: max abs diff {diff}"


# ---------------------------------------------------------------- real models (slow)


@pytest.fixture(scope="module", params=MODELS)
def real_model(request, hf_reference):
    cfg, params = load_model_params(request.param, cache=False)
    seconds = last_load_info().seconds
    model = hf_reference(request.param)
    print(f"\n{request.param}: our load {seconds:.1f}s (uncached)")
    yield request.param, cfg, params, model.state_dict()
    del params


@pytest.mark.slow
def test_real_gguf_params_match_transformers(real_model):
    _, cfg, params, state_dict = real_model
    assert_matches_torch(cfg, params, state_dict)


@pytest.mark.slow
def test_real_gguf_config(real_model):
    name, cfg, _, _ = real_model
    if name == "gemma3-270m":
        assert (cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads) == ("gemma3", 640, 18, 4)
        assert (cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window) == (1, 256, 512)
        assert [i for i in range(cfg.num_layers) if not cfg.is_sliding_layer(i)] == [5, 11, 17]
        assert cfg.query_pre_attn_scalar == 256 and cfg.tie_embeddings and 106 in cfg.eos_token_ids
        assert cfg.layer_rope_thetas()[0] == 10000.0 and cfg.layer_rope_thetas()[5] == 1e6
    else:
        assert (cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads) == ("llama", 576, 30, 9)
        assert (cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size, cfg.rope_theta) == (3, 64, 49152, 100000.0)
        assert cfg.tie_embeddings and cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)


@pytest.mark.slow
def test_params_cache_real_model(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    _, first = load_model_params("smollm2-135m-instruct")
    info1 = last_load_info()
    _, second = load_model_params("smollm2-135m-instruct")
    info2 = last_load_info()
    print(f"\nsmollm2 first load {info1.seconds:.2f}s, cached load {info2.seconds:.2f}s")
    assert not info1.from_cache and info2.from_cache and info2.cache_entry == info1.cache_entry
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        assert a.dtype == b.dtype and bool((a == b).all())


# ---------------------------------------------------------------- Hugging Face directories


def tiny_hf(tmp_path: Path, arch: str, tied: bool = True, shard: bool = False, bf16: bool = False):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    common = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=tied,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=5e5))
    else:
        config = Gemma3TextConfig(
            **common,
            sliding_window=16,
            query_pre_attn_scalar=8,
            layer_types=["sliding_attention", "full_attention"] * 2,
        )
        model = Gemma3ForCausalLM(config)
    with torch.no_grad():  # norms start at 0 (gemma) or 1 (llama); make them distinctive
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p))
    if bf16:
        model = model.to(torch.bfloat16)
    out = tmp_path / f"tiny-{arch}"
    model.save_pretrained(out, max_shard_size="40KB" if shard else "5GB")
    return out, model.state_dict()


@pytest.mark.parametrize(
    "arch,tied,shard",
    [("llama", False, False), ("llama", True, True), ("gemma3", True, False), ("gemma3", True, True)],
)
def test_hf_directory_matches_state_dict(tmp_path, arch, tied, shard):
    directory, state_dict = tiny_hf(tmp_path, arch, tied=tied, shard=shard)
    assert (directory / "model.safetensors.index.json").exists() == shard
    cfg, params = load_hf(directory)
    assert cfg.arch == arch and cfg.tie_embeddings == tied and ("lm_head" in params) == (not tied)
    assert_matches_torch(cfg, params, state_dict, atol=1e-6 if arch == "gemma3" else 0)  # (w+1)-1 rounds
    if arch == "gemma3":
        assert (cfg.sliding_window, cfg.sliding_window_pattern, cfg.query_pre_attn_scalar) == (16, 2, 8)
        assert cfg.layer_windows() == [16, 0, 16, 0] and cfg.activation == "gelu_tanh"
    else:
        assert cfg.rope_theta == 5e5 and cfg.activation == "silu"


def test_dtype_selection(tmp_path):
    directory, state_dict = tiny_hf(tmp_path, "llama", bf16=True)
    cfg, p32 = load_model_params(str(directory), dtype="float32", cache=False)
    assert {x.dtype for x in jax.tree.leaves(p32)} == {np.dtype("float32")}
    assert_matches_torch(cfg, p32, state_dict, atol=0)  # bf16 -> f32 is exact
    _, p16 = load_model_params(str(directory), dtype="bfloat16", cache=False)
    assert {str(x.dtype) for x in jax.tree.leaves(p16)} == {"bfloat16"}
    with pytest.raises(SpecRagError, match="unsupported dtype 'float16'"):
        load_model_params(str(directory), dtype="float16")


def test_cache_rebuilds_corrupt_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    directory, _ = tiny_hf(tmp_path, "gemma3")
    _, ref = load_model_params(str(directory))
    entry = Path(last_load_info().cache_entry)
    for damage in ("delete", "config"):
        if damage == "delete":
            victim = max((p for p in (entry / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
            victim.unlink()
        else:
            (entry / "config.json").write_text("{not json")
        _, again = load_model_params(str(directory))
        assert not last_load_info().from_cache, damage
        assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(again)))
        load_model_params(str(directory))
        assert last_load_info().from_cache
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entry.name]  # no temp dirs left


# ---------------------------------------------------------------- dequantisation


def _f16(raw: np.ndarray) -> float:
    return float(raw[:2].view(np.float16)[0])


def _scale_min_k4(j: int, q: list[int]) -> tuple[int, int]:
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def ref_block(qtype: QT, b: np.ndarray) -> list[float]:
    """Straight transcription of ggml's dequantize_row_* for one block."""
    y = [0.0] * (32 if qtype in (QT.Q8_0, QT.Q4_1, QT.Q5_0) else 256)
    if qtype == QT.Q8_0:
        return [_f16(b) * int(v) for v in b[2:34].view(np.int8)]
    u = [int(v) for v in b]  # python ints: no uint8 wrap-around below
    if qtype == QT.Q4_1:
        d, m, qs = _f16(b), _f16(b[2:]), u[4:20]
        for j in range(16):
            y[j], y[j + 16] = d * (qs[j] & 0xF) + m, d * (qs[j] >> 4) + m
        return y
    if qtype == QT.Q5_0:
        d, qh, qs = _f16(b), int(b[2:6].view("<u4")[0]), u[6:22]
        for j in range(16):
            y[j] = d * (((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16)
            y[j + 16] = d * (((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16)
        return y
    if qtype in (QT.Q4_K, QT.Q5_K):
        d, dmin, sc = _f16(b), _f16(b[2:]), u[4:16]
        qh, ql = (u[16:48], u[48:176]) if qtype == QT.Q5_K else (None, u[16:144])
        for n, j in enumerate(range(0, 256, 64)):
            (s1, m1), (s2, m2) = _scale_min_k4(2 * n, sc), _scale_min_k4(2 * n + 1, sc)
            for i in range(32):
                hi1 = 16 * ((qh[i] >> (2 * n)) & 1) if qh is not None else 0
                hi2 = 16 * ((qh[i] >> (2 * n + 1)) & 1) if qh is not None else 0
                y[j + i] = d * s1 * ((ql[32 * n + i] & 0xF) + hi1) - dmin * m1
                y[j + 32 + i] = d * s2 * ((ql[32 * n + i] >> 4) + hi2) - dmin * m2
        return y
    assert qtype == QT.Q6_K
    ql, qh, sc, d = u[0:128], u[128:192], [int(v) for v in b[192:208].view(np.int8)], _f16(b[208:])
    for h in range(2):
        for i in range(32):
            L, H, S = ql[64 * h :], qh[32 * h :], sc[8 * h :]
            q1 = ((L[i] & 0xF) | (((H[i] >> 0) & 3) << 4)) - 32
            q2 = ((L[i + 32] & 0xF) | (((H[i] >> 2) & 3) << 4)) - 32
            q3 = ((L[i] >> 4) | (((H[i] >> 4) & 3) << 4)) - 32
            q4 = ((L[i + 32] >> 4) | (((H[i] >> 6) & 3) << 4)) - 32
            base = 128 * h + i
            y[base], y[base + 32] = d * S[i // 16] * q1, d * S[i // 16 + 2] * q2
            y[base + 64], y[base + 96] = d * S[i // 16 + 4] * q3, d * S[i // 16 + 6] * q4
    return y


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_1, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K])
def test_dequantize_matches_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(3, type_size), dtype=np.uint8)
    scales = rng.uniform(-0.5, 0.5, size=(3, 2)).astype(np.float16).view(np.uint8)
    at = type_size - 2 if qtype == QT.Q6_K else 0
    blocks[:, at : at + 2] = scales[:, :2]
    if qtype in (QT.Q4_1, QT.Q4_K, QT.Q5_K):
        blocks[:, 2:4] = scales[:, 2:4]
    got = dequantize(blocks.reshape(1, -1), qtype).reshape(-1)
    want = np.concatenate([np.asarray(ref_block(qtype, b), dtype=np.float64) for b in blocks])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize(
    "qtype,tol", [(QT.F32, 0), (QT.F16, 2e-3), (QT.BF16, 2e-2), (QT.Q8_0, 0.02), (QT.Q4_1, 0.3), (QT.Q5_0, 0.2)]
)
def test_quantize_round_trip(qtype, tol):
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    back = dequantize(quantize(x, qtype), qtype)
    assert back.dtype == np.float32 and back.shape == x.shape
    assert np.abs(back - x).max() <= tol


# ---------------------------------------------------------------- tiny GGUF files and errors


def write_gguf(path: Path, arch: str = "llama", drop: str = "", odd_type: str = "", extra: tuple = ()) -> Path:
    """A 2-layer llama (or qwen2, with q/k/v biases) GGUF of F32 tensors; ``drop`` omits a tensor, ``odd_type``
    stores one as Q8_1, ``extra`` adds tensors the architecture does not have."""
    rng = np.random.default_rng(1)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    for key, value in dict(
        block_count=2,
        context_length=64,
        embedding_length=32,
        feed_forward_length=64,
        head_count=4,
        head_count_kv=2,
        layer_norm_rms_eps=1e-5,
    ).items():
        getattr(writer, f"add_{key}")(value)
    shapes = {"token_embd.weight": (97, 32), "output_norm.weight": (32,)}
    for i in range(2):
        shapes.update(
            {
                f"blk.{i}.attn_q.weight": (32, 32),
                f"blk.{i}.attn_k.weight": (16, 32),
                f"blk.{i}.attn_v.weight": (16, 32),
                f"blk.{i}.attn_output.weight": (32, 32),
                f"blk.{i}.ffn_gate.weight": (64, 32),
                f"blk.{i}.ffn_up.weight": (64, 32),
                f"blk.{i}.ffn_down.weight": (32, 64),
                f"blk.{i}.attn_norm.weight": (32,),
                f"blk.{i}.ffn_norm.weight": (32,),
            }
        )
        if arch == "qwen2":
            shapes.update({f"blk.{i}.attn_q.bias": (32,), f"blk.{i}.attn_k.bias": (16,), f"blk.{i}.attn_v.bias": (16,)})
    shapes.update({name: (32,) for name in extra})
    for name, shape in shapes.items():
        if name == drop:
            continue
        if name == odd_type:
            block, size = gguf.GGML_QUANT_SIZES[QT.Q8_1]
            writer.add_tensor(name, np.zeros((shape[0], shape[1] // block * size), np.uint8), raw_dtype=QT.Q8_1)
        else:
            writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_tiny_gguf_loads(tmp_path):
    cfg, params = load_gguf(write_gguf(tmp_path / "tiny.gguf"))
    assert (cfg.arch, cfg.num_layers, cfg.head_dim, cfg.name) == ("llama", 2, 8, "tiny")
    shapes = {k: tuple(v) for k, v in flat(param_shapes(cfg)).items()}
    assert {k: v.shape for k, v in flat(params).items()} == shapes


def test_tiny_qwen2_gguf_keeps_qk_rows_and_biases(tmp_path):
    path = write_gguf(tmp_path / "q.gguf", arch="qwen2")
    cfg, params = load_gguf(path)
    assert cfg.arch == "qwen2" and cfg.attention_bias and cfg.tie_embeddings
    raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    # llama.cpp does not permute qwen2's Q/K rows: the kernel is the stored [out, in] matrix.
    np.testing.assert_array_equal(np.asarray(params["layers"]["attn"]["q"]["kernel"][1]), raw["blk.1.attn_q.weight"])
    np.testing.assert_array_equal(np.asarray(params["layers"]["attn"]["k"]["bias"][0]), raw["blk.0.attn_k.bias"])
    llama_cfg, llama = load_gguf(write_gguf(tmp_path / "l.gguf"))
    assert not llama_cfg.attention_bias and "bias" not in llama["layers"]["attn"]["q"]


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda d: d / "absent.gguf", ["does not exist", "absent.gguf"]),
        (lambda d: (d / "x.gguf").write_text("hello, not a model") and d / "x.gguf", ["not a GGUF", "bad magic"]),
        (lambda d: write_gguf(d / "m.gguf", arch="mamba"), ["unsupported architecture", "'mamba'"]),
        (lambda d: write_gguf(d / "m.gguf", drop="blk.1.ffn_up.weight"), ["missing tensor", "blk.1.ffn_up.weight"]),
        (
            lambda d: write_gguf(d / "m.gguf", odd_type="blk.0.attn_v.weight"),
            ["unsupported quantization type Q8_1", "blk.0.attn_v.weight"],
        ),
        (lambda d: d / "empty-dir", ["no config.json"]),
        (
            lambda d: write_gguf(d / "m.gguf", arch="qwen2", drop="blk.1.attn_k.bias"),
            ["missing tensor", "blk.1.attn_k.bias"],
        ),
        (
            lambda d: write_gguf(d / "m.gguf", arch="qwen2", extra=("blk.0.attn_output.bias",)),
            ["unsupported tensors", "blk.0.attn_output.bias"],
        ),
    ],
    ids=["missing", "not-gguf", "mamba", "missing-tensor", "bad-quant", "not-hf-dir", "qwen2-no-bias", "qwen2-o-bias"],
)
def test_errors(tmp_path, make, words):
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(SpecRagError) as err:
        load_model_params(str(make(tmp_path)), cache=False)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


@pytest.mark.parametrize(
    "nbytes,words", [(50_000_000, ["truncated", "tensor 'blk."]), (4096, ["truncated GGUF header"])]
)
def test_truncated_gguf(tmp_path, nbytes, words):
    source = resolve_model_path("smollm2-135m-instruct")
    target = tmp_path / "cut.gguf"
    with open(source, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read(nbytes))
    with pytest.raises(SpecRagError) as err:
        load_model_params(str(target), cache=False)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
    target.unlink()
