"""Read a Hugging Face checkpoint directory (config.json + *.safetensors) of a supported decoder family.

Supports ``LlamaForCausalLM`` (model_type "llama"), ``MistralForCausalLM`` ("mistral": Llama's tensors, a
sliding window), ``Qwen2ForCausalLM`` ("qwen2": q/k/v biases), ``Qwen3ForCausalLM`` ("qwen3": per-head q/k
norms), ``MixtralForCausalLM`` ("mixtral": per-expert ``block_sparse_moe.experts.{j}.w1/w2/w3`` stacked on an
expert axis, or the fused in-memory ``mlp.experts.gate_up_proj``) and ``Gemma3ForCausalLM`` ("gemma3_text",
or "gemma3" with a ``text_config``); the config is read by ``hf_config.py``. Shards listed in
``model.safetensors.index.json`` are opened lazily, one tensor at a time (``load_hf``; ``load_model_params``
streams them block by block into their shardings with ``hf_streaming``, from the same ``hf_plan``; an index
that lists a shard file the directory lacks is an error naming it). Hugging Face Gemma norms
store ``w`` and apply ``1 + w``; we add the 1 so every norm scale is multiplicative.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.loading.hf_config import hf_config_to_model_config, read_config
from specrag_jax.models.loading.params import LeafFn, assemble_params

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
_LLAMA = {**_COMMON, "layers/mlp_norm/scale": "layers.{i}.post_attention_layernorm.weight"}
_QK_NORMS = {
    "layers/attn/q_norm/scale": "layers.{i}.self_attn.q_norm.weight",
    "layers/attn/k_norm/scale": "layers.{i}.self_attn.k_norm.weight",
}
HF_NAMES: dict[str, dict[str, str]] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": {
        **_LLAMA,
        "layers/attn/q/bias": "layers.{i}.self_attn.q_proj.bias",
        "layers/attn/k/bias": "layers.{i}.self_attn.k_proj.bias",
        "layers/attn/v/bias": "layers.{i}.self_attn.v_proj.bias",
    },
    "qwen3": {**_LLAMA, **_QK_NORMS},
    # As save_pretrained writes Mixtral (transformers 5.24 converts its fused in-memory experts back to these).
    "mixtral": {
        **{k: v for k, v in _LLAMA.items() if "/mlp/" not in k},
        "layers/mlp/router/kernel": "layers.{i}.block_sparse_moe.gate.weight",
        "layers/mlp/gate/kernel": "layers.{i}.block_sparse_moe.experts.{j}.w1.weight",
        "layers/mlp/up/kernel": "layers.{i}.block_sparse_moe.experts.{j}.w3.weight",
        "layers/mlp/down/kernel": "layers.{i}.block_sparse_moe.experts.{j}.w2.weight",
    },
    "gemma3": {
        **_COMMON,
        **_QK_NORMS,
        "layers/post_attn_norm/scale": "layers.{i}.post_attention_layernorm.weight",
        "layers/mlp_norm/scale": "layers.{i}.pre_feedforward_layernorm.weight",
        "layers/post_mlp_norm/scale": "layers.{i}.post_feedforward_layernorm.weight",
    },
}
# transformers' in-memory Mixtral layout (fused gate_up_proj [E, 2I, H]; "#gate"/"#up" select the halves).
MIXTRAL_FUSED = {
    "layers/mlp/router/kernel": "layers.{i}.mlp.gate.weight",
    "layers/mlp/gate/kernel": "layers.{i}.mlp.experts.gate_up_proj#gate",
    "layers/mlp/up/kernel": "layers.{i}.mlp.experts.gate_up_proj#up",
    "layers/mlp/down/kernel": "layers.{i}.mlp.experts.down_proj",
}
_MODEL_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
LM_HEADS = ("lm_head.weight", "language_model.lm_head.weight")


def _tensor_index(directory: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that holds it."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise SpecRagError(f"cannot read {index}: {exc}") from None
        missing = sorted({file for file in weight_map.values() if not (directory / file).is_file()})
        if missing:
            more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
            raise SpecRagError(
                f"checkpoint in {directory} is missing shard file {missing[0]!r}{more}, listed in {index.name}"
            )
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


@dataclasses.dataclass(frozen=True)
class HFPlan:
    """What a Hugging Face directory holds and where each of our leaves comes from."""

    directory: Path
    cfg: ModelConfig
    names: dict[str, str]  # our leaf -> full tensor name ("{i}" layer, "{j}" expert, "#gate"/"#up" fused halves)
    index: dict[str, Path]  # every tensor name -> its safetensors file
    norm_offset: float  # added to every norm scale (1 for Gemma's ``1 + w``)
    prefix: str  # the language model's tensor-name prefix ("model.", "model.language_model.", ...)


def hf_plan(directory: str | Path) -> HFPlan:
    """Read config.json and the tensor index of a Hugging Face directory; map our leaves to its tensor names."""
    directory = Path(directory)
    cfg = hf_config_to_model_config(read_config(directory), name=directory.name)
    index = _tensor_index(directory)
    prefix = next((p for p in _MODEL_PREFIXES if f"{p}embed_tokens.weight" in index), None)
    if prefix is None:
        raise SpecRagError(f"checkpoint in {directory} is missing tensor 'model.embed_tokens.weight'")
    table = dict(HF_NAMES[cfg.arch])
    if cfg.num_experts and f"{prefix}layers.0.mlp.experts.gate_up_proj" in index:
        table.update(MIXTRAL_FUSED)
    names = {leaf: prefix + n for leaf, n in table.items()}
    head = next((h for h in LM_HEADS if h in index), None)
    if not cfg.tie_embeddings:
        if head is None:
            warnings.warn(
                f"{directory}: tie_word_embeddings is false but lm_head.weight is missing; tying", stacklevel=2
            )
            cfg = cfg.replace(tie_embeddings=True)
        else:
            names["lm_head/kernel"] = head
    return HFPlan(directory, cfg, names, index, 1.0 if cfg.arch == "gemma3" else 0.0, prefix)


def load_hf(directory: str | Path, leaf_fn: LeafFn | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Load a Hugging Face directory into ``(ModelConfig, params)``.

    Leaves are float32 numpy arrays, or whatever ``leaf_fn`` makes of each one. (Each stacked leaf is built
    on the host; ``hf_streaming.load_hf_streaming`` places bounded blocks straight into a sharding instead.)
    """
    plan = hf_plan(directory)
    directory, cfg, names, index, norm_offset = plan.directory, plan.cfg, plan.names, plan.index, plan.norm_offset
    handles: dict[Path, Any] = {}

    def fetch(name: str, leaf: str) -> np.ndarray:
        name, _, half = name.partition("#")
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
        if half:  # fused [E, 2I, H]: gate rows then up rows
            w = np.split(w, 2, axis=1)[half == "up"]
        if leaf.endswith("scale") and norm_offset:
            w = w + np.float32(norm_offset)
        return w

    try:
        params = assemble_params(cfg, names, fetch, leaf_fn)
    finally:
        handles.clear()
    return cfg, params
