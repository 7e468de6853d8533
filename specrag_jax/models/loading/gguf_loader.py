"""Read a GGUF file (llama.cpp) into a ``ModelConfig`` and a float32 numpy parameter tree.

The header is parsed by ``gguf_header``; ``gguf_plan`` maps tensors into the stacked Linen tree of
``param_shapes(cfg)`` (GGML ``[out, in]`` rows -> our ``[in, out]`` kernels) and ``dequant`` dequantises them,
bit-exact with ``gguf.quants.dequantize``. ``load_gguf`` builds the tree in memory; ``convert_gguf_file`` writes
it straight into a safetensors file (the converted-weights cache) through a memory map, never whole in memory.
Llama-architecture files have Q/K rows permuted by llama.cpp for its interleaved RoPE; we undo
that (as transformers' ``reverse_permute_weights`` does) so the model can use rotate-half RoPE.
Qwen2 and Qwen3 files are not permuted (llama.cpp runs them with NEOX, i.e. rotate-half, RoPE); Qwen3's
per-head norms are ``attn_q_norm`` / ``attn_k_norm`` as Gemma 3's. Mistral models arrive as "llama" files
(llama.cpp's converter writes no sliding window for them). Mixtral files are "llama" files with
``llama.expert_count`` / ``llama.expert_used_count`` (read as our "mixtral" arch, Q/K permuted as Llama's): a
router ``blk.{i}.ffn_gate_inp`` and experts ``ffn_{gate,up,down}_exps`` stacked on an expert axis, or, in older
files, one ``ffn_{gate,up,down}.{j}`` tensor per expert.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ARCH_DEFAULTS, ModelConfig
from specrag_jax.models.loading.dequant import SUPPORTED as SUPPORTED_QUANT_TYPES
from specrag_jax.models.loading.gguf_header import GGUFFile
from specrag_jax.models.loading.gguf_plan import (
    GGUF_MOE_LEGACY_NAMES,
    GGUF_MOE_NAMES,
    GGUF_NAMES,
    WORKERS,
    plan_leaves,
    reverse_permute_qk,
    run_jobs,
)
from specrag_jax.models.loading.param_file import allocate_tree
from specrag_jax.models.loading.params import LeafFn, unflatten

__all__ = [
    "GGUF_MOE_LEGACY_NAMES",
    "GGUF_MOE_NAMES",
    "GGUF_NAMES",
    "SUPPORTED_QUANT_TYPES",
    "convert_gguf_file",
    "gguf_config",
    "load_gguf",
    "open_gguf",
    "reverse_permute_qk",
]

GEMMA3_END_OF_TURN = 106
GGUF_ARCHITECTURES = ("gemma3", "llama", "qwen2", "qwen3")  # general.architecture values we read


def open_gguf(path: str | Path) -> GGUFFile:
    """Open and validate a GGUF file, turning every failure into a one-line SpecRagError."""
    path = Path(path)
    if not path.is_file():
        raise SpecRagError(f"GGUF file not found: {path}")
    try:
        return GGUFFile(path, keep=lambda key: False)
    except OSError as exc:
        raise SpecRagError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None


def gguf_config(reader: GGUFFile, path: str | Path = "") -> ModelConfig:
    """Build a ``ModelConfig`` from a GGUF header (plus ``ARCH_DEFAULTS`` for what it lacks)."""
    arch = str(reader.field("general.architecture"))
    if arch not in GGUF_ARCHITECTURES:
        raise SpecRagError(
            f"unsupported architecture {arch!r} in GGUF file {path}; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise SpecRagError(f"GGUF file {path} is missing tensor 'token_embd.weight'")
    if "rope_freqs.weight" in tensors or reader.field(f"{arch}.rope.scaling.type", "none") not in ("none",):
        raise SpecRagError(f"GGUF file {path} uses RoPE scaling, which is not supported")
    hidden = int(reader.field(f"{arch}.embedding_length"))
    heads = int(reader.field(f"{arch}.attention.head_count"))
    kv_heads = reader.field(f"{arch}.attention.head_count_kv", heads)
    ffn = reader.field(f"{arch}.feed_forward_length")
    if isinstance(kv_heads, list) or isinstance(ffn, list):
        raise SpecRagError(f"GGUF file {path} has per-layer head/FFN sizes, which are not supported")
    head_dim = int(reader.field(f"{arch}.attention.key_length", hidden // heads))
    rope_dim = int(reader.field(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise SpecRagError(f"GGUF file {path} uses partial RoPE ({rope_dim} of {head_dim}), not supported")
    values: dict[str, Any] = dict(ARCH_DEFAULTS[arch])
    values.update(
        arch=arch,
        vocab_size=int(tensors["token_embd.weight"].shape[1]),
        hidden_size=hidden,
        intermediate_size=int(ffn),
        num_layers=int(reader.field(f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        rms_norm_eps=float(reader.field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(reader.field(f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(reader.field(f"{arch}.context_length", 8192)),
        tie_embeddings="output.weight" not in tensors,
        bos_token_id=reader.field("tokenizer.ggml.bos_token_id", None),
        name=str(reader.field("general.name", Path(path).stem)),
    )
    if arch != "gemma3":
        values["rope_local_theta"] = values["rope_theta"]  # no local layers: one RoPE base (as hf_config sets it)
    experts = int(reader.field(f"{arch}.expert_count", 0) or 0)
    if experts:
        if arch != "llama":
            raise SpecRagError(f"GGUF file {path}: {arch} with experts ({arch}.expert_count) is not supported")
        if int(reader.field(f"{arch}.expert_shared_count", 0) or 0):
            raise SpecRagError(f"GGUF file {path}: shared experts ({arch}.expert_shared_count) are not supported")
        if int(reader.field(f"{arch}.expert_gating_func", 1) or 1) != 1:
            raise SpecRagError(f"GGUF file {path}: expert gating other than softmax is not supported")
        values.update(
            ARCH_DEFAULTS["mixtral"],
            arch="mixtral",
            num_experts=experts,
            experts_per_token=int(reader.field(f"{arch}.expert_used_count")),
        )
    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = reader.field(key, None)
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    if arch == "gemma3":
        values["sliding_window"] = int(reader.field("gemma3.attention.sliding_window", 512))
        values["query_pre_attn_scalar"] = float(head_dim)
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if (
            tokens is not None
            and len(tokens) > GEMMA3_END_OF_TURN
            and tokens[GEMMA3_END_OF_TURN] == "<end_of_turn>"
            and GEMMA3_END_OF_TURN not in eos
        ):
            eos.append(GEMMA3_END_OF_TURN)
    values["eos_token_ids"] = tuple(eos)
    if values["bos_token_id"] is not None:
        values["bos_token_id"] = int(values["bos_token_id"])
    return ModelConfig(**values)


def load_gguf(path: str | Path, leaf_fn: LeafFn | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Load a GGUF file into ``(ModelConfig, params)`` matching ``param_shapes``.

    Leaves are float32 numpy arrays, or whatever ``leaf_fn`` makes of each one (each leaf is finished before the
    next is built, so peak memory is the converted tree plus about one leaf).
    """
    reader = open_gguf(path)
    cfg = gguf_config(reader, path)
    finish = leaf_fn or (lambda x: x)
    flat: dict[str, Any] = {}
    with ThreadPoolExecutor(WORKERS) as pool:
        for leaf, (shape, jobs) in plan_leaves(cfg, reader).items():
            dest = np.empty(shape, np.float32)
            run_jobs(reader, [(job, dest) for job in jobs], pool)
            flat[leaf] = finish(dest)
            del dest
    return cfg, unflatten(flat)


def convert_gguf_file(path: str | Path, dtype: str, out: str | Path) -> ModelConfig:
    """Write a GGUF file's parameter tree as the safetensors file ``out`` (``param_file`` format, leaves of
    ``dtype``), dequantising straight into a memory map of it on two threads: the bytes ``save_tree`` would
    write for ``load_gguf``'s tree, without that tree ever being in memory."""
    reader = open_gguf(path)
    cfg = gguf_config(reader, path)
    plan = plan_leaves(cfg, reader)
    views = allocate_tree(out, {leaf: (shape, np.dtype(dtype)) for leaf, (shape, _) in plan.items()})
    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            run_jobs(reader, [(job, views[leaf]) for leaf, (_, jobs) in plan.items() for job in jobs], pool)
    finally:
        views.clear()  # unmaps the file
    return cfg
