"""Where every GGUF tensor goes in the stacked parameter tree, and the chunked copy that puts it there.

``plan_leaves`` maps each leaf of ``param_shapes(cfg)`` to its source tensors (one ``Job`` per matrix: per layer,
per expert), checking names, quantization types and shapes up front, so a bad file fails before anything is
written. ``fill`` dequantises one job into its slot of a destination array (in memory, or a memory map of the cache
file) a few hundred KiB of rows at a time: GGML stores matrices as ``[out, in]`` rows, as our kernels are, except
the MoE block's (``[in, out]``, ``kernel_in_out``), whose rows are written transposed. Llama-architecture Q/K rows,
permuted by llama.cpp for its interleaved RoPE, are put back in rotate-half order (as transformers'
``reverse_permute_weights`` does) by reordering the quantised rows before dequantisation, which is exact because
rows dequantise independently. ``run_jobs`` spreads the jobs over two threads (numpy releases the GIL in its
loops); scratch buffers are per thread and reused, since fresh pages are costly here (every new page of this VM
faults in from the host).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig, kernel_in_out, param_shapes
from specrag_jax.models.loading.dequant import SUPPORTED, dequantize_rows
from specrag_jax.models.loading.gguf_header import GGUFFile, GGUFTensor
from specrag_jax.models.loading.params import check_shape, flatten_shapes

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
GGUF_MOE_NAMES = {
    "layers/mlp/router/kernel": "blk.{i}.ffn_gate_inp.weight",
    **{f"layers/mlp/{n}/kernel": f"blk.{{i}}.ffn_{n}_exps.weight" for n in _FFN},
}
GGUF_MOE_LEGACY_NAMES = {
    **GGUF_MOE_NAMES,
    **{f"layers/mlp/{n}/kernel": f"blk.{{i}}.ffn_{n}.{{j}}.weight" for n in _FFN},
}
CHUNK_BYTES = 256 << 10  # float32 rows dequantised per step (in cache for the transposed write)
MIN_KERNEL_ROWS = 32  # a transposed write puts at least this many floats (128 bytes) per destination row
WORKERS = max(1, min(2, os.cpu_count() or 1))


@dataclasses.dataclass(frozen=True)
class Job:
    """One source matrix or vector into ``slot`` of its leaf (``expert``: its index in a stacked source)."""

    tensor: GGUFTensor
    slot: tuple[int, ...]
    expert: int | None = None
    kernel: bool = False
    qk_heads: int = 0  # > 0: reverse llama.cpp's Q/K row permutation for this many heads


def reverse_permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved -> rotate-half RoPE layout)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def names_for(cfg: ModelConfig, gguf: GGUFFile) -> dict[str, str]:
    """Leaf -> GGUF name template for this model (the MoE tables when it has experts)."""
    names = dict(GGUF_NAMES)
    if cfg.num_experts:
        stacked = any(t.name == "blk.0.ffn_gate_exps.weight" for t in gguf.tensors)
        names.update(GGUF_MOE_NAMES if stacked else GGUF_MOE_LEGACY_NAMES)
    return names


def plan_leaves(cfg: ModelConfig, gguf: GGUFFile) -> dict[str, tuple[tuple[int, ...], list[Job]]]:
    """Leaf -> (shape, jobs) for the whole tree; every tensor of the file must be used exactly as expected."""
    tensors = {t.name: t for t in gguf.tensors}
    names, used = names_for(cfg, gguf), set()
    heads = {"layers/attn/q/kernel": cfg.num_heads, "layers/attn/k/kernel": cfg.num_kv_heads}
    permuted = cfg.arch in ("llama", "mixtral")

    def job(name: str, leaf: str, slot: tuple[int, ...], want: tuple[int, ...]) -> list[Job]:
        t = tensors.get(name)
        if t is None:
            raise SpecRagError(f"GGUF file {gguf.path} is missing tensor {name!r}")
        if t.tensor_type not in SUPPORTED:
            raise SpecRagError(f"tensor {name!r} has unsupported quantization type {t.tensor_type.name} in {gguf.path}")
        used.add(name)
        kernel = kernel_in_out(leaf, cfg)  # written transposed
        shape = tuple(reversed(t.shape))
        check_shape(name, shape[:-2] + shape[:-3:-1] if kernel else shape, want)
        qk = heads.get(leaf, 0) if permuted else 0
        if kernel and len(shape) == 3:  # experts stacked on the first axis
            return [Job(t, slot + (e,), e, True, qk) for e in range(shape[0])]
        return [Job(t, slot, None, kernel, qk)]

    plan = {}
    for leaf, shape in flatten_shapes(param_shapes(cfg)).items():
        template, jobs = names[leaf], []
        if not leaf.startswith("layers/"):
            jobs = job(template, leaf, (), shape)
        for i in range(cfg.num_layers if leaf.startswith("layers/") else 0):
            if "{j}" in template:  # one tensor per expert
                for j in range(cfg.num_experts):
                    jobs += job(template.format(i=i, j=j), leaf, (i, j), shape[2:])
            else:
                jobs += job(template.format(i=i), leaf, (i,), shape[1:])
        plan[leaf] = (shape, jobs)
    unused = sorted(set(tensors) - used)
    if unused:
        more = f" (+{len(unused) - 3} more)" if len(unused) > 3 else ""
        raise SpecRagError(f"GGUF file {gguf.path} has unsupported tensors {', '.join(unused[:3])}{more}")
    return plan


class Scratch(threading.local):
    """Per-thread float32 buffers, reused across chunks and jobs (fresh pages are costly to fault in)."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.size < size:
            buf = self.buffers[name] = np.empty(size, np.float32)
        return buf[:size].reshape(shape)


_SCRATCH = Scratch()


def fill(gguf: GGUFFile, job: Job, dest: np.ndarray) -> None:
    """Dequantise ``job``'s tensor into ``dest[job.slot]`` (float32 or bfloat16, cast per chunk)."""
    raw = gguf.raw(job.tensor)
    raw = (raw[job.expert] if job.expert is not None else raw).reshape(-1, raw.shape[-1])
    rows, cols, qtype = raw.shape[0], job.tensor.shape[0], job.tensor.tensor_type
    if job.qk_heads:
        raw = raw[reverse_permute_qk(np.arange(rows), job.qk_heads)]
    slot = dest[job.slot]
    target = slot.reshape(cols, rows).T if job.kernel else slot.reshape(rows, cols)  # [rows, cols] view
    try:
        if target.dtype == np.float32 and not job.kernel:
            dequantize_rows(raw, qtype, target)  # straight into place, a chunk of rows at a time
            return
        step = max(MIN_KERNEL_ROWS if job.kernel else 1, CHUNK_BYTES // (4 * cols))
        for r0 in range(0, rows, step):
            buf = _SCRATCH.get("rows", (min(step, rows - r0), cols))
            dequantize_rows(raw[r0 : r0 + step], qtype, buf)
            with np.errstate(invalid="ignore"):  # NaN -> bfloat16 NaN
                target[r0 : r0 + step] = buf  # transposed and/or cast
    except ValueError as exc:
        raise SpecRagError(f"cannot dequantize tensor {job.tensor.name!r} ({qtype.name}): {exc}") from None


def run_jobs(gguf: GGUFFile, work: Iterable[tuple[Job, np.ndarray]], pool: ThreadPoolExecutor | None = None) -> None:
    """``fill`` every (job, destination), on ``pool``'s threads if given; the first error is raised."""
    if pool is None:
        for job, dest in work:
            fill(gguf, job, dest)
        return
    futures = [pool.submit(fill, gguf, job, dest) for job, dest in work]
    try:
        for future in futures:
            future.result()
    except BaseException:
        for future in futures:  # nothing more is started once a job has failed (or Ctrl-C)
            future.cancel()
        raise
