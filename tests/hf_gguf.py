"""transformers' own GGUF loader (config, tensor names, tensor processors, model class), with gguf-py's
dequantiser swapped for ours while it runs.

transformers (its legacy GGUF path, the one Llama, Qwen2 and Gemma 3 take) calls ``gguf.dequantize`` on every
tensor; gguf-py's block dequantisers are slow (most of the 1.5B Qwen reference's load). Ours are equal to them bit
for bit (tests/models/loading/test_dequant.py: random and adversarial blocks of every type, all 65,536 float16
scales), so the reference model is the same; everything else in the load stays transformers' own."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np


def fast_dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """``gguf.quants.dequantize``'s contract (raw blocks ``[..., row_bytes]`` -> float32 ``[..., cols]``)."""
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    from specrag_jax.models.loading.dequant import KERNELS, dequantize_rows

    if qtype not in KERNELS or data.dtype != np.uint8:  # F32/F16 (already typed): gguf-py's is a view or a cast
        return dequantize(data, qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = data.reshape(-1, data.shape[-1])
    out = np.empty((raw.shape[0], raw.shape[1] // type_size * block), np.float32)
    dequantize_rows(raw, qtype, out)
    return out.reshape(*data.shape[:-1], out.shape[1])


@contextmanager
def fast_gguf_dequantize() -> Iterator[None]:
    """``gguf.dequantize`` is ``fast_dequantize`` inside the block (transformers imports it at call time)."""
    import gguf

    original = gguf.dequantize
    gguf.dequantize = fast_dequantize
    try:
        yield
    finally:
        gguf.dequantize = original


def transformers_gguf_model(name: str):
    """The transformers float32 model of a registry name's GGUF, in eval mode (2 torch threads)."""
    import torch
    from transformers import AutoModelForCausalLM

    from specrag_jax.models.loading.registry import resolve_model_path

    torch.set_num_threads(2)
    path = resolve_model_path(name)
    with fast_gguf_dequantize():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()
