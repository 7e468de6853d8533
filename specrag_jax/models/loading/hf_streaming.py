"""Stream a Hugging Face checkpoint (``config.json`` + safetensors shards) straight into device parameters.

Every tensor is read block by block through a memory map of that tensor only (``param_file.read_block``),
converted on the host (float32, MoE kernels transposed to ``[in, out]``, Gemma's ``1 + w``, fused Mixtral halves)
and placed with its leaf's target sharding by ``streaming.place``: per device, zeros of its shard, filled
in place a bounded chunk at a time. Stacked ``[L, ...]`` leaves are filled layer by layer the same way, so
the host holds about one chunk, never a layer's stacked leaf or the model, and a device receives only its
part. The abstract tree (shapes, dtypes, hence the shardings) comes from ``jax.eval_shape`` of the model's
init. Before any data is read, every tensor the model needs is checked (present, shape) and every tensor of
the language model is accounted for: a missing or unexpected tensor, or a shard file that the index lists but
the directory lacks, is a one-line SpecRagError naming it. Unsharded results are bit-identical to
``hf_loader.load_hf`` followed by ``load.to_jax_leaf`` (the same numpy casts, in the same order).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig, kernel_in_out, param_shapes
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.loading.hf_loader import LM_HEADS, HFPlan, hf_plan
from specrag_jax.models.loading.param_file import TensorInfo, read_block, read_header
from specrag_jax.models.loading.params import check_shape, flatten_shapes, flatten_tree, unflatten
from specrag_jax.models.loading.streaming import Index, Reader, ShardingsFn, flat_shardings, kernel_order, place

# Tensors a checkpoint may carry that the model does not use (older Llama exports saved RoPE's inverse
# frequencies; a tied model may still store lm_head, which transformers ignores as well).
IGNORED = re.compile(r"\.rotary_emb\.inv_freq$")


@dataclasses.dataclass(frozen=True)
class _Source:
    """One stored tensor seen in our layout: MoE kernels ``[.., in, out]``, a fused half selected, norms offset."""

    info: TensorInfo
    kernel: bool
    half: str  # "", "gate" or "up" (halves of a fused ``[E, 2I, H]`` gate_up_proj)
    offset: float

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.info.shape)
        if self.half:
            shape[1] = shape[1] // 2 if shape[1] % 2 == 0 else -shape[1]  # odd: never matches
        if self.kernel:
            shape[-1], shape[-2] = shape[-2], shape[-1]
        return tuple(shape)

    def read(self, index: Index) -> np.ndarray:
        src = list(index)
        if self.kernel:
            src[-1], src[-2] = src[-2], src[-1]
        if self.half == "up":
            shift = self.info.shape[1] // 2
            src[1] = slice(src[1].start + shift, src[1].stop + shift)
        block = read_block(self.info, tuple(src), copy=False).astype(np.float32)  # a copy: the map closes
        if self.kernel:
            block = np.swapaxes(block, -1, -2)
        return block + np.float32(self.offset) if self.offset else block


def _read_experts(sources: list[Reader], index: Index) -> np.ndarray:
    return np.stack([sources[j](index[1:]) for j in range(index[0].start, index[0].stop)])


def _read_layers(layers: list[Reader], index: Index) -> np.ndarray:
    rows = range(index[0].start, index[0].stop)
    if len(rows) == 1:
        return layers[rows[0]](index[1:])[None]
    return np.stack([layers[i](index[1:]) for i in rows])


def tensor_infos(plan: HFPlan) -> dict[str, TensorInfo]:
    """Header entries of every tensor in the checkpoint (each shard's header read once, no data)."""
    by_file: dict[Path, list[str]] = {}
    for name, file in plan.index.items():
        by_file.setdefault(file, []).append(name)
    out: dict[str, TensorInfo] = {}
    for file, names in by_file.items():
        header = read_header(file)
        for name in names:
            if name not in header:
                raise SpecRagError(
                    f"checkpoint in {plan.directory}: tensor {name!r} is not in {file.name}, where the index puts it"
                )
            out[name] = header[name]
    return out


def leaf_readers(plan: HFPlan, infos: dict[str, TensorInfo]) -> dict[str, Reader]:
    """A reader per leaf of ``param_shapes`` (checking every source tensor's presence and shape first)."""
    cfg, used = plan.cfg, set()

    def source(name: str, leaf: str, want: tuple[int, ...]) -> Reader:
        base, _, half = name.partition("#")
        info = infos.get(base)
        if info is None:
            raise SpecRagError(f"checkpoint in {plan.directory} is missing tensor {base!r}")
        used.add(base)
        src = _Source(info, kernel_in_out(leaf, cfg), half, plan.norm_offset if leaf.endswith("scale") else 0.0)
        check_shape(name, src.shape, want)
        return src.read

    readers: dict[str, Reader] = {}
    for leaf, shape in flatten_shapes(param_shapes(cfg)).items():
        template = plan.names[leaf]
        if not leaf.startswith("layers/"):
            readers[leaf] = source(template, leaf, shape)
            continue
        layers: list[Reader] = []
        for i in range(cfg.num_layers):
            if "{j}" in template:  # one tensor per expert, stacked on a leading expert axis
                experts = [source(template.format(i=i, j=j), leaf, shape[2:]) for j in range(cfg.num_experts)]
                layers.append(functools.partial(_read_experts, experts))
            else:
                layers.append(source(template.format(i=i), leaf, shape[1:]))
        readers[leaf] = functools.partial(_read_layers, layers)
    _check_unexpected(plan, used)
    return readers


def _check_unexpected(plan: HFPlan, used: set[str]) -> None:
    """Every language-model tensor must be used (vision towers etc. under other prefixes are skipped)."""
    extra = sorted(
        n
        for n in plan.index
        if (n.startswith(plan.prefix) or n in LM_HEADS)
        and n not in used
        and not IGNORED.search(n)
        and not (n in LM_HEADS and plan.cfg.tie_embeddings)
    )
    if extra:
        more = f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""
        raise SpecRagError(
            f"checkpoint in {plan.directory} has unexpected tensor {extra[0]!r}{more}; "
            f"the {plan.cfg.arch} model has no parameter for it"
        )


@functools.lru_cache(maxsize=8)
def abstract_params(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """The parameter tree as ``jax.ShapeDtypeStruct`` leaves (``jax.eval_shape`` of the model's init: no memory).

    Checked against ``param_shapes(cfg)``, the tree the loaders' name tables cover."""
    tree = jax.eval_shape(functools.partial(init_params, cfg, 0, jnp.dtype(dtype)))
    got = {k: tuple(v.shape) for k, v in flatten_tree(tree).items()}
    want = flatten_shapes(param_shapes(cfg))
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))
        raise SpecRagError(f"{cfg.name or cfg.arch}: model tree and loader layout disagree on {diff[:3]}")
    return tree


def load_hf_streaming(
    directory: str | Path, dtype: str = "float32", shardings: ShardingsFn | None = None
) -> tuple[ModelConfig, dict[str, Any]]:
    """``(ModelConfig, params)`` from a Hugging Face directory, leaves jax arrays of ``dtype``.

    ``shardings(cfg, abstract_tree)``: a Sharding per leaf (e.g. ``Placement.param_shardings``); each leaf is
    then created directly in it, each device reading only its part. Without it: the default device."""
    plan = hf_plan(directory)
    readers = leaf_readers(plan, tensor_infos(plan))
    abstract = flatten_tree(abstract_params(plan.cfg, dtype))
    sh = flat_shardings(shardings, plan.cfg, unflatten(abstract))
    out = {}
    for leaf, spec in ((leaf, abstract[leaf]) for leaf in readers):
        order = kernel_order(len(spec.shape)) if kernel_in_out(leaf, plan.cfg) else None
        out[leaf] = place(spec.shape, spec.dtype, sh.get(leaf), readers[leaf], order)
    return plan.cfg, unflatten(out)
