"""Read a Hugging Face checkpoint directory (config.json + *.safetensors) for Llama, Qwen2 and Gemma 3.

Supports ``LlamaForCausalLM`` (model_type "llama"), ``Qwen2ForCausalLM`` (model_type "qwen2": q/k/v
biases) and ``Gemma3ForCausalLM`` (model_type "gemma3_text", or "gemma3" with a ``text_config``). Shards listed in
``model.safetensors.index.json`` are opened lazily, one tensor at a time. Hugging Face Gemma norms
store ``w`` and apply ``1 + w``; we add the 1 so every norm scale is multiplicative.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ARCH_DEFAULTS, ModelConfig
from specrag_jax.models.gguf_loader import LeafFn, assemble_params

_COMMON = {
    "embed/embedding": "embed_tokens.weight",
    "final_norm/scale": "norm.weight",
    "layers/attn_norm/scale": "layers.{i}.input_layernorm.weight",
    "layers/attn/q/kernel": "layers.{i}.self_attn.q_proj.weight",
    "layers/attn/k/kernel": "layers.{i}.self_attn.k_proj.weight",
    "layers/attn/v/kernel": "layers.{i}.self_attn.v_proj.weight",
    "layers/attn/o/kernel": "layers.{i}.self_attn.o_proj.weight",
    "layers/mlp/gate/kernel": "layers.{i}.mlp.gate_proj.weight",
    "layers/mlp/up/kernel": "layers.{i}.mlp.up_proj.weight",
    "layers/mlp/down/kernel": "layers.{i}.mlp.down_proj.weight",
}
# Our leaf -> HF name without the "model." prefix ("lm_head/kernel" is resolved separately).
HF_NAMES: dict[str, dict[str, str]] = {
    "llama": {**_COMMON, "layers/mlp_norm/scale": "layers.{i}.post_attention_layernorm.weight"},
    "qwen2": {
        **_COMMON,
        "layers/mlp_norm/scale": "layers.{i}.post_attention_layernorm.weight",
        "layers/attn/q/bias": "layers.{i}.self_attn.q_proj.bias",
        "layers/attn/k/bias": "layers.{i}.self_attn.k_proj.bias",
        "layers/attn/v/bias": "layers.{i}.self_attn.v_proj.bias",
    },
    "gemma3": {
        **_COMMON,
        "layers/attn/q_norm/scale": "layers.{i}.self_attn.q_norm.weight",
        "layers/attn/k_norm/scale": "layers.{i}.self_attn.k_norm.weight",
        "layers/post_attn_norm/scale": "layers.{i}.post_attention_layernorm.weight",
        "layers/mlp_norm/scale": "layers.{i}.pre_feedforward_layernorm.weight",
        "layers/post_mlp_norm/scale": "layers.{i}.post_feedforward_layernorm.weight",
    },
}
_MODEL_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
_LM_HEADS = ("lm_head.weight", "language_model.lm_head.weight")
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise SpecRagError(f"not a Hugging Face model directory (no config.json): {directory}")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecRagError(f"cannot read {path}: {exc}") from None


def _rope(cfg: dict[str, Any]) -> tuple[float, float]:
    """(global theta, local theta) from either the v5 ``rope_parameters`` or the older keys."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling") or {}
    if isinstance(params, dict) and "full_attention" in params:
        full, local = params["full_attention"], params.get("sliding_attention", {})
    elif isinstance(params, dict):
        full, local = params, {}
    else:
        full = {"rope_theta": cfg.get("rope_theta", 10000.0), **scaling}
        local = {}
    for p in (full, local):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in ("default", None):
            raise SpecRagError(f"RoPE scaling type {kind!r} is not supported")
    local_theta = local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))
    return float(full.get("rope_theta", 10000.0)), float(local_theta)


def _sliding_pattern(cfg: dict[str, Any], num_layers: int) -> int:
    """Gemma 3's "every N-th layer is global" period, checked against ``layer_types`` if given."""
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6
    types = cfg.get("layer_types")
    if not types:
        return int(pattern)
    if "full_attention" in types:
        pattern = types.index("full_attention") + 1
    elif len(types) >= pattern:
        pattern = len(types) + 1
    expected = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    if list(types) != expected:
        raise SpecRagError(f"layer_types {types} is not a periodic sliding/global pattern")
    return int(pattern)


def hf_config_to_model_config(raw: dict[str, Any], name: str = "") -> ModelConfig:
    """Translate a Hugging Face ``config.json`` dict into our ``ModelConfig``."""
    model_type = raw.get("model_type")
    cfg = raw
    if model_type == "gemma3":
        cfg = {**raw.get("text_config", {}), "tie_word_embeddings": raw.get("tie_word_embeddings", True)}
        model_type = "gemma3_text"
    arch = {"llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3"}.get(str(model_type))
    if arch is None:
        raise SpecRagError(
            f"unsupported Hugging Face model_type {model_type!r}; supported: llama, qwen2, gemma3_text")
    if (cfg.get("attention_bias") and arch != "qwen2") or cfg.get("mlp_bias"):
        raise SpecRagError(f"{model_type}: attention/MLP biases are not supported")
    if arch == "qwen2" and cfg.get("use_sliding_window"):
        raise SpecRagError("qwen2: use_sliding_window=true (sliding-window layers) is not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or ("gelu_pytorch_tanh" if arch == "gemma3" else "silu")
    if act not in _ACTIVATIONS:
        raise SpecRagError(f"unsupported activation {act!r}")
    heads = int(cfg["num_attention_heads"])
    rope_theta, local_theta = _rope(cfg)
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
    values: dict[str, Any] = dict(ARCH_DEFAULTS[arch])
    values.update(
        arch=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", arch == "gemma3")),
        activation=_ACTIVATIONS[act],
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        name=name,
    )
    if arch == "gemma3":
        values.update(
            rope_local_theta=local_theta,
            sliding_window=cfg.get("sliding_window"),
            sliding_window_pattern=_sliding_pattern(cfg, values["num_layers"]),
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or values["head_dim"]),
            attn_logit_softcap=cfg.get("attn_logit_softcapping"),
            final_logit_softcap=cfg.get("final_logit_softcapping"),
        )
    return ModelConfig(**values)


def _tensor_index(directory: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that holds it."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise SpecRagError(f"cannot read {index}: {exc}") from None
        return {name: directory / file for name, file in weight_map.items()}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise SpecRagError(f"no *.safetensors files in {directory}")
    out: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(file, framework="numpy") as fh:
                out.update({name: file for name in fh.keys()})
        except Exception as exc:
            raise SpecRagError(f"cannot read safetensors file {file}: {exc}") from None
    return out


def load_hf(directory: str | Path, leaf_fn: LeafFn | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Load a Hugging Face directory into ``(ModelConfig, params)``.

    Leaves are float32 numpy arrays, or whatever ``leaf_fn`` makes of each one.
    """
    directory = Path(directory)
    cfg = hf_config_to_model_config(_read_config(directory), name=directory.name)
    index = _tensor_index(directory)
    prefix = next((p for p in _MODEL_PREFIXES if f"{p}embed_tokens.weight" in index), None)
    if prefix is None:
        raise SpecRagError(f"checkpoint in {directory} is missing tensor 'model.embed_tokens.weight'")
    names = {leaf: prefix + n for leaf, n in HF_NAMES[cfg.arch].items()}
    head = next((h for h in _LM_HEADS if h in index), None)
    if not cfg.tie_embeddings:
        if head is None:
            warnings.warn(f"{directory}: tie_word_embeddings is false but lm_head.weight is missing; tying")
            cfg = cfg.replace(tie_embeddings=True)
        else:
            names["lm_head/kernel"] = head
    norm_offset = 1.0 if cfg.arch == "gemma3" else 0.0
    handles: dict[Path, Any] = {}

    def fetch(name: str, leaf: str) -> np.ndarray:
        file = index.get(name)
        if file is None:
            raise SpecRagError(f"checkpoint in {directory} is missing tensor {name!r}")
        try:
            if file not in handles:
                handles[file] = safe_open(file, framework="numpy")
            w = handles[file].get_tensor(name)
        except Exception as exc:
            raise SpecRagError(f"cannot read tensor {name!r} from {file}: {exc}") from None
        w = np.asarray(w, dtype=np.float32)
        if leaf.endswith("scale") and norm_offset:
            w = w + np.float32(norm_offset)
        return w

    try:
        params = assemble_params(cfg, names, fetch, leaf_fn)
    finally:
        handles.clear()
    return cfg, params
