"""Hugging Face ``config.json`` -> ``ModelConfig`` (Llama, Mistral, Mixtral, Qwen2, Qwen3, Gemma 3).

Each family is a row of ``FAMILIES`` (model_type -> our arch); what the decoder cannot run is refused in
``unsupported_features`` with a one-line error naming the key. Sliding windows become ``layer_types``:
Mistral slides on every layer, Qwen2/Qwen3 (``use_sliding_window``) per their ``layer_types`` (or layers from
``max_window_layers`` on, as transformers derives them), Gemma 3 by its periodic pattern. Mixtral is Mistral's
attention plus ``num_local_experts`` / ``num_experts_per_tok``; its training-only router fields
(``router_aux_loss_coef``, ``router_jitter_noise``, ``output_router_logits``) do not change inference and are
ignored. Experts in any other family, shared experts and unnormalised top-k are refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ARCH_DEFAULTS, ModelConfig

FAMILIES = {
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
}
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def read_config(directory: Path) -> dict[str, Any]:
    """The parsed config.json of a checkpoint folder (one-line errors)."""
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
    for p in (full, local, scaling):  # an old-style rope_scaling beside rope_parameters is refused too
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


def _layer_types(cfg: dict[str, Any], arch: str, num_layers: int) -> tuple[int | None, tuple[str, ...]]:
    """(sliding window, per-layer types) of the Llama-block families, as transformers builds their masks."""
    window = cfg.get("sliding_window")
    if arch in ("mistral", "mixtral"):
        return (int(window), ("sliding_attention",) * num_layers) if window else (None, ())
    if arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window") and window:
        types = cfg.get("layer_types") or [
            "sliding_attention" if i >= int(cfg.get("max_window_layers", 28)) else "full_attention"
            for i in range(num_layers)
        ]
        return (int(window), tuple(types)) if "sliding_attention" in types else (None, ())
    return None, ()


def unsupported_features(cfg: dict[str, Any], model_type: str, arch: str) -> None:
    """Raise a one-line SpecRagError naming the first config feature the decoder does not implement."""
    checks = [
        ("attention_bias=true", bool(cfg.get("attention_bias")) and arch != "qwen2"),
        ("mlp_bias=true", bool(cfg.get("mlp_bias"))),
        (
            "num_experts / num_local_experts (mixture of experts)",
            arch != "mixtral" and bool(cfg.get("num_local_experts") or cfg.get("num_experts")),
        ),
        (
            "shared experts (shared_expert_intermediate_size / n_shared_experts)",
            bool(cfg.get("shared_expert_intermediate_size") or cfg.get("n_shared_experts")),
        ),
        ("norm_topk_prob=false (unnormalised top-k routing)", cfg.get("norm_topk_prob") is False),
        (
            "moe_intermediate_size (per-expert width differing from intermediate_size)",
            arch == "mixtral" and cfg.get("moe_intermediate_size") not in (None, cfg.get("intermediate_size")),
        ),
    ]
    for feature, present in checks:
        if present:
            raise SpecRagError(f"{model_type}: {feature} is not supported")


def hf_config_to_model_config(raw: dict[str, Any], name: str = "") -> ModelConfig:
    """Translate a Hugging Face ``config.json`` dict into our ``ModelConfig``."""
    model_type = raw.get("model_type")
    cfg = raw
    if model_type == "gemma3":
        cfg = {**raw.get("text_config", {}), "tie_word_embeddings": raw.get("tie_word_embeddings", True)}
        model_type = "gemma3_text"
    arch = FAMILIES.get(str(model_type))
    if arch is None:
        raise SpecRagError(
            f"unsupported Hugging Face model_type {model_type!r}; supported: {', '.join(sorted(FAMILIES))}"
        )
    unsupported_features(cfg, str(model_type), arch)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or ("gelu_pytorch_tanh" if arch == "gemma3" else "silu")
    if act not in _ACTIVATIONS:
        raise SpecRagError(f"{model_type}: activation {act!r} is not supported")
    heads = int(cfg["num_attention_heads"])
    rope_theta, local_theta = _rope(cfg)
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
    num_layers = int(cfg["num_hidden_layers"])
    values: dict[str, Any] = dict(ARCH_DEFAULTS[arch])
    values.update(
        arch=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_local_theta=rope_theta,
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
            sliding_window_pattern=_sliding_pattern(cfg, num_layers),
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or values["head_dim"]),
            attn_logit_softcap=cfg.get("attn_logit_softcapping"),
            final_logit_softcap=cfg.get("final_logit_softcapping"),
        )
    else:
        values["sliding_window"], values["layer_types"] = _layer_types(cfg, arch, num_layers)
    if arch == "mixtral":
        values.update(
            num_experts=int(cfg.get("num_local_experts") or 0),
            experts_per_token=int(cfg.get("num_experts_per_tok") or 0),
        )
        if values["num_experts"] < 1:
            raise SpecRagError(f"{model_type}: num_local_experts must be >= 1, got {cfg.get('num_local_experts')}")
    return ModelConfig(**values)
