"""Read a GGUF file (llama.cpp) into a ``ModelConfig`` and a float32 numpy parameter tree.

Tensors are dequantised with ``gguf.quants.dequantize`` and mapped into the stacked Linen tree of
``param_shapes(cfg)``: GGML stores matrices as ``[out, in]`` rows, our kernels are ``[in, out]``.
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

import math
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ARCH_DEFAULTS, ModelConfig, param_shapes
from specrag_jax.models.tree_paths import flatten_tree, unflatten

Q = GGMLQuantizationType
SUPPORTED_QUANT_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)
GEMMA3_END_OF_TURN = 106
GGUF_ARCHITECTURES = ("gemma3", "llama", "qwen2", "qwen3")  # general.architecture values we read

# Our leaf ("layers/..." paths use "{i}" for the layer index) -> GGUF tensor name.
GGUF_NAMES: dict[str, str] = {
    "embed/embedding": "token_embd.weight",
    "final_norm/scale": "output_norm.weight",
    "lm_head/kernel": "output.weight",
    "layers/attn_norm/scale": "blk.{i}.attn_norm.weight",
    "layers/attn/q/kernel": "blk.{i}.attn_q.weight",
    "layers/attn/k/kernel": "blk.{i}.attn_k.weight",
    "layers/attn/v/kernel": "blk.{i}.attn_v.weight",
    "layers/attn/q/bias": "blk.{i}.attn_q.bias",
    "layers/attn/k/bias": "blk.{i}.attn_k.bias",
    "layers/attn/v/bias": "blk.{i}.attn_v.bias",
    "layers/attn/o/kernel": "blk.{i}.attn_output.weight",
    "layers/attn/q_norm/scale": "blk.{i}.attn_q_norm.weight",
    "layers/attn/k_norm/scale": "blk.{i}.attn_k_norm.weight",
    "layers/post_attn_norm/scale": "blk.{i}.post_attention_norm.weight",
    "layers/mlp_norm/scale": "blk.{i}.ffn_norm.weight",
    "layers/mlp/gate/kernel": "blk.{i}.ffn_gate.weight",
    "layers/mlp/up/kernel": "blk.{i}.ffn_up.weight",
    "layers/mlp/down/kernel": "blk.{i}.ffn_down.weight",
    "layers/post_mlp_norm/scale": "blk.{i}.post_ffw_norm.weight",
}
# Mixture of experts: experts stacked on one axis (current llama.cpp), or one tensor per expert (older files).
_FFN = ("gate", "up", "down")
GGUF_MOE_NAMES = {"layers/mlp/router/kernel": "blk.{i}.ffn_gate_inp.weight",
                  **{f"layers/mlp/{n}/kernel": f"blk.{{i}}.ffn_{n}_exps.weight" for n in _FFN}}
GGUF_MOE_LEGACY_NAMES = {**GGUF_MOE_NAMES,
                         **{f"layers/mlp/{n}/kernel": f"blk.{{i}}.ffn_{n}.{{j}}.weight" for n in _FFN}}


def flatten_shapes(tree: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Flatten ``param_shapes(cfg)`` into ``{"layers/attn/q/kernel": shape}``."""
    return {path: tuple(shape) for path, shape in flatten_tree(tree, is_leaf=lambda x: isinstance(x, tuple)).items()}


LeafFn = Callable[[np.ndarray], Any]


def assemble_params(
    cfg: ModelConfig,
    names: Mapping[str, str],
    fetch: Callable[[str, str], np.ndarray],
    leaf_fn: LeafFn | None = None,
) -> dict[str, Any]:
    """Build the stacked tree; ``fetch(source_name, leaf)`` returns an ``[out, in]`` (experts: ``[E, out, in]``)
    float32 array; a name with ``{j}`` is fetched once per expert and stacked.

    Kernels are transposed to ``[in, out]``; per-layer tensors are written into one stacked array.
    Each finished float32 leaf goes through ``leaf_fn`` (e.g. a cast to a jax array) before the next
    is built, so peak memory is the converted tree plus about one leaf.
    """
    finish = leaf_fn or (lambda x: x)
    flat: dict[str, Any] = {}
    for leaf, shape in flatten_shapes(param_shapes(cfg)).items():
        template = names[leaf]
        kernel = leaf.endswith("kernel")
        if not leaf.startswith("layers/"):
            w = fetch(template, leaf)
            w = np.ascontiguousarray(w.T if kernel else w, dtype=np.float32)
            _check_shape(template, w.shape, shape)
            flat[leaf] = finish(w)
            del w
            continue
        stacked = np.empty(shape, dtype=np.float32)
        for i in range(cfg.num_layers):
            name = template.replace("{j}", "*").format(i=i)
            if "{j}" in template:  # one tensor per expert: stacked on a leading expert axis
                w = np.stack([_fetch_checked(fetch, template.format(i=i, j=j), leaf, shape[2:])
                              for j in range(cfg.num_experts)])
            else:
                w = fetch(name, leaf)
            w = np.swapaxes(w, -1, -2) if kernel else w  # [E,] out, in -> [E,] in, out
            _check_shape(name, w.shape, shape[1:])
            stacked[i] = w
        flat[leaf] = finish(stacked)
        del stacked
    return unflatten(flat)


def _fetch_checked(fetch: Callable[[str, str], np.ndarray], name: str, leaf: str,
                   want: tuple[int, ...]) -> np.ndarray:
    """One expert's ``[out, in]`` tensor, its shape checked (as ``[in, out]``) before stacking."""
    w = fetch(name, leaf)
    _check_shape(name, w.shape[::-1], want)
    return w


def _check_shape(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise SpecRagError(f"tensor {name!r} has shape {tuple(got)} ([in, out] for matrices), expected {tuple(want)}")


def reverse_permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved -> rotate-half RoPE layout)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


class _CheckedReader(GGUFReader):
    """GGUFReader that checks every tensor's type and byte extent before gguf slices the mmap."""

    def __init__(self, path: Path) -> None:
        self._path = path
        super().__init__(path, "r")

    def _build_fields(self, offs: int, count: int) -> int:  # gguf internal hook
        # Slicing an np.memmap is slow (262k-token vocabularies take ~10 s); a plain ndarray view of
        # the same mapping parses several times faster and keeps the mapping alive through ``.base``.
        self.data = self.data.view(np.ndarray)
        return super()._build_fields(offs, count)

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:  # gguf internal hook
        size = len(self.data)
        for field in fields:
            _, name_data, _, dims, raw_type, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                qtype = GGMLQuantizationType(int(raw_type[0]))
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise SpecRagError(
                    f"tensor {name!r} has unknown GGML type id {int(raw_type[0])} in {self._path}"
                ) from None
            start = start_offs + int(offset[0])
            end = start + math.prod(int(d) for d in dims) * type_size // block
            if end > size:
                raise SpecRagError(
                    f"GGUF file is truncated: tensor {name!r} needs bytes up to {end} but the file "
                    f"has {size}: {self._path}"
                )
        super()._build_tensors(start_offs, fields)


def _dequantize_rows(data: np.ndarray, qtype: GGMLQuantizationType, chunk: int = 8192) -> np.ndarray:
    """Dequantise to a fresh float32 array, a block of rows at a time to bound temporaries."""
    if data.ndim < 2 or data.shape[0] <= chunk:
        # F32 comes back as a view of the mmap: copy so no result keeps the file mapped.
        return np.array(dequantize(data, qtype), dtype=np.float32, copy=qtype == Q.F32)
    first = dequantize(data[:chunk], qtype)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=np.float32)
    out[:chunk] = first
    for start in range(chunk, data.shape[0], chunk):
        out[start : start + chunk] = dequantize(data[start : start + chunk], qtype)
    return out


def open_gguf(path: str | Path) -> GGUFReader:
    """Open and validate a GGUF file, turning every failure into a one-line SpecRagError."""
    path = Path(path)
    if not path.is_file():
        raise SpecRagError(f"GGUF file not found: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise SpecRagError(f"not a GGUF file (bad magic {magic!r}): {path}")
    try:
        reader = _CheckedReader(path)
    except SpecRagError:
        raise
    except Exception as exc:  # gguf raises ValueError/IndexError/KeyError/... on corrupt headers
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecRagError(f"corrupt or truncated GGUF header in {path}: {detail}") from None
    size = len(reader.data)
    for t in reader.tensors:  # second guard in case gguf's internal hook changed
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise SpecRagError(f"GGUF file is truncated: tensor {t.name!r} is cut off: {path}")
    return reader


def _field(reader: GGUFReader, key: str, default: Any = ...) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise SpecRagError(f"GGUF metadata key {key!r} is missing")
        return default
    return field.contents()


def gguf_config(reader: GGUFReader, path: str | Path = "") -> ModelConfig:
    """Build a ``ModelConfig`` from a GGUF header (plus ``ARCH_DEFAULTS`` for what it lacks)."""
    arch = str(_field(reader, "general.architecture"))
    if arch not in GGUF_ARCHITECTURES:
        raise SpecRagError(
            f"unsupported architecture {arch!r} in GGUF file {path}; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise SpecRagError(f"GGUF file {path} is missing tensor 'token_embd.weight'")
    if "rope_freqs.weight" in tensors or _field(reader, f"{arch}.rope.scaling.type", "none") not in ("none",):
        raise SpecRagError(f"GGUF file {path} uses RoPE scaling, which is not supported")
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv", heads)
    ffn = _field(reader, f"{arch}.feed_forward_length")
    if isinstance(kv_heads, list) or isinstance(ffn, list):
        raise SpecRagError(f"GGUF file {path} has per-layer head/FFN sizes, which are not supported")
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    rope_dim = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise SpecRagError(f"GGUF file {path} uses partial RoPE ({rope_dim} of {head_dim}), not supported")
    values: dict[str, Any] = dict(ARCH_DEFAULTS[arch])
    values.update(
        arch=arch,
        vocab_size=int(tensors["token_embd.weight"].shape[1]),
        hidden_size=hidden,
        intermediate_size=int(ffn),
        num_layers=int(_field(reader, f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 8192)),
        tie_embeddings="output.weight" not in tensors,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", None),
        name=str(_field(reader, "general.name", Path(path).stem)),
    )
    if arch != "gemma3":
        values["rope_local_theta"] = values["rope_theta"]  # no local layers: one RoPE base (as hf_config sets it)
    experts = int(_field(reader, f"{arch}.expert_count", 0) or 0)
    if experts:
        if arch != "llama":
            raise SpecRagError(f"GGUF file {path}: {arch} with experts ({arch}.expert_count) is not supported")
        if int(_field(reader, f"{arch}.expert_shared_count", 0) or 0):
            raise SpecRagError(f"GGUF file {path}: shared experts ({arch}.expert_shared_count) are not supported")
        if int(_field(reader, f"{arch}.expert_gating_func", 1) or 1) != 1:
            raise SpecRagError(f"GGUF file {path}: expert gating other than softmax is not supported")
        values.update(ARCH_DEFAULTS["mixtral"], arch="mixtral", num_experts=experts,
                      experts_per_token=int(_field(reader, f"{arch}.expert_used_count")))
    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = _field(reader, key, None)
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    if arch == "gemma3":
        values["sliding_window"] = int(_field(reader, "gemma3.attention.sliding_window", 512))
        values["query_pre_attn_scalar"] = float(head_dim)
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if (
            tokens is not None
            and len(tokens.data) > GEMMA3_END_OF_TURN
            and tokens.contents(GEMMA3_END_OF_TURN) == "<end_of_turn>"
            and GEMMA3_END_OF_TURN not in eos
        ):
            eos.append(GEMMA3_END_OF_TURN)
    values["eos_token_ids"] = tuple(eos)
    if values["bos_token_id"] is not None:
        values["bos_token_id"] = int(values["bos_token_id"])
    return ModelConfig(**values)


def load_gguf(path: str | Path, leaf_fn: LeafFn | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Load a GGUF file into ``(ModelConfig, params)`` matching ``param_shapes``.

    Leaves are float32 numpy arrays, or whatever ``leaf_fn`` makes of each one.
    """
    path = Path(path)
    reader = open_gguf(path)
    cfg = gguf_config(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    used: set[str] = set()
    permute = {"layers/attn/q/kernel": cfg.num_heads, "layers/attn/k/kernel": cfg.num_kv_heads}
    names = dict(GGUF_NAMES)
    if cfg.num_experts:
        names.update(GGUF_MOE_NAMES if "blk.0.ffn_gate_exps.weight" in tensors else GGUF_MOE_LEGACY_NAMES)

    def fetch(name: str, leaf: str) -> np.ndarray:
        tensor = tensors.get(name)
        if tensor is None:
            raise SpecRagError(f"GGUF file {path} is missing tensor {name!r}")
        if tensor.tensor_type not in SUPPORTED_QUANT_TYPES:
            raise SpecRagError(
                f"tensor {name!r} has unsupported quantization type {tensor.tensor_type.name} in {path}"
            )
        used.add(name)
        try:
            w = _dequantize_rows(tensor.data, tensor.tensor_type)
        except Exception as exc:
            raise SpecRagError(f"cannot dequantize tensor {name!r} ({tensor.tensor_type.name}): {exc}") from None
        if cfg.arch in ("llama", "mixtral") and leaf in permute:
            w = reverse_permute_qk(w, permute[leaf])
        return w

    params = assemble_params(cfg, names, fetch, leaf_fn)
    unused = sorted(set(tensors) - used)
    if unused:
        more = f" (+{len(unused) - 3} more)" if len(unused) > 3 else ""
        raise SpecRagError(f"GGUF file {path} has unsupported tensors {', '.join(unused[:3])}{more}")
    return cfg, params
