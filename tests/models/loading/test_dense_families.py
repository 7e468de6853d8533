"""Qwen3 and Mistral beyond logits parity (test_hf_parity.py): GGUF names, config translation, bad input."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.gguf_loader import GGUF_NAMES, load_gguf
from specrag_jax.models.loading.hf_config import hf_config_to_model_config
from specrag_jax.models.loading.hf_loader import HF_NAMES, load_hf
from specrag_jax.models.loading.params import flatten_tree

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def tiny_qwen3(directory, tie: bool = False):
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(**BASE, head_dim=16, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=tie)
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(directory)
    return model.state_dict()


def write_qwen3_gguf(path, state: dict, num_layers: int = 2) -> None:
    """The tensors llama.cpp writes for a Qwen3 checkpoint (qwen3 arch: attn_q_norm/attn_k_norm, no Q/K
    permutation), as F32, from a transformers state dict."""
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("tiny-qwen3")
    for key, value in dict(
        block_count=num_layers,
        context_length=128,
        embedding_length=32,
        feed_forward_length=48,
        head_count=4,
        head_count_kv=2,
        key_length=16,
        value_length=16,
        layer_norm_rms_eps=1e-6,
        rope_freq_base=1e6,
    ).items():
        getattr(writer, f"add_{key}")(value)
    for leaf, hf_name in {**HF_NAMES["qwen3"], "lm_head/kernel": "lm_head.weight"}.items():
        full = hf_name if hf_name.startswith("lm_head") else "model." + hf_name
        for i in range(num_layers) if "{i}" in full else [None]:
            tensor = state[full.format(i=i)].numpy().astype(np.float32)
            name = GGUF_NAMES[leaf] if i is None else GGUF_NAMES[leaf].format(i=i)
            writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_qwen3_gguf_equals_the_hf_checkpoint(tmp_path):
    state = tiny_qwen3(tmp_path / "hf")
    write_qwen3_gguf(tmp_path / "q.gguf", state)
    hf_cfg, hf_params = load_hf(tmp_path / "hf")
    gg_cfg, gg_params = load_gguf(tmp_path / "q.gguf")
    same = dict(name="", bos_token_id=None, eos_token_ids=(), rms_norm_eps=1e-6)  # GGUF stores eps as float32
    assert gg_cfg.replace(**same) == hf_cfg.replace(**same)
    assert gg_cfg.arch == "qwen3" and gg_cfg.qk_norm and gg_cfg.head_dim == 16 and not gg_cfg.attention_bias
    ours, theirs = flatten_tree(gg_params), flatten_tree(hf_params)
    assert sorted(ours) == sorted(theirs) and "layers/attn/q_norm/scale" in ours
    for leaf in ours:
        np.testing.assert_array_equal(np.asarray(ours[leaf]), np.asarray(theirs[leaf]), err_msg=leaf)


def test_mistral_config_translation():
    cfg = hf_config_to_model_config(transformers.MistralConfig(**BASE, sliding_window=16).to_dict())
    assert (cfg.arch, cfg.sliding_window, cfg.layer_windows()) == ("mistral", 16, [16, 16])
    assert not cfg.qk_norm and not cfg.attention_bias
    unwindowed = hf_config_to_model_config(transformers.MistralConfig(**BASE, sliding_window=None).to_dict())
    assert unwindowed.layer_windows() == [0, 0] and unwindowed.layer_types == ()


def test_cached_config_round_trips(tmp_path):
    from specrag_jax.models.loading.weights_cache import config_from_json, config_to_json

    cfg = hf_config_to_model_config(transformers.MistralConfig(**BASE, sliding_window=16).to_dict())
    again = config_from_json(config_to_json(cfg))
    assert again == cfg and hash(again) == hash(cfg)  # layer_types comes back a tuple: still a jit static


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: transformers.Qwen3Config(**BASE, attention_bias=True).to_dict(), ["qwen3", "attention_bias=true"]),
        (lambda: transformers.LlamaConfig(**BASE, mlp_bias=True).to_dict(), ["llama", "mlp_bias=true"]),
        (lambda: {**transformers.Qwen3Config(**BASE).to_dict(), "num_experts": 8}, ["qwen3", "mixture of experts"]),
        (
            lambda: {
                **transformers.MistralConfig(**BASE).to_dict(),
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            },
            ["RoPE scaling type 'yarn'"],
        ),
        (lambda: {**transformers.MistralConfig(**BASE).to_dict(), "hidden_act": "relu"}, ["mistral", "'relu'"]),
        (lambda: {"model_type": "mamba"}, ["unsupported Hugging Face model_type 'mamba'", "qwen3", "mistral"]),
        (
            lambda: {
                **transformers.Qwen3Config(**BASE, use_sliding_window=True, sliding_window=8).to_dict(),
                "layer_types": ["sliding_attention"],
            },
            ["layer_types must name 2 layers"],
        ),
    ],
    ids=["qwen3-bias", "mlp-bias", "experts", "yarn", "relu", "mamba", "layer-types"],
)
def test_unsupported_configs_are_one_line_errors(tmp_path, make, words):
    (tmp_path / "config.json").write_text(json.dumps(make()))
    with pytest.raises(SpecRagError) as err:
        load_hf(tmp_path)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message
