"""transformers' own GGUF loader (config, tensor names, tensor processors, model class), with gguf-py's
dequantiser swapped for ours and its reader parsing each file once while it runs.

transformers (its legacy GGUF path, the one Llama, Qwen2 and Gemma 3 take) calls ``gguf.dequantize`` on every
tensor; gguf-py's block dequantisers are slow (most of the 1.5B Qwen reference's load). Ours are equal to them bit
for bit (tests/models/loading/test_dequant.py: random and adversarial blocks of every type, all 65,536 float16
scales), so the reference model is the same; everything else in the load stays transformers' own.

gguf-py's reader slices a ``np.memmap`` for every field part (Qwen's 151k-token vocabulary and merges: 1.5M
slices, each through memmap's Python-level ``__getitem__``), and transformers builds a reader twice per load
(config, then weights): 38 s of the 1.5B reference's load under a profiler. ``ParsedOnceReader`` reads the same
bytes through a plain ndarray view of the same map and keeps one reader per file for the block."""

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


def parsed_once_reader_class():
    """A ``gguf.GGUFReader`` whose slices are plain ndarray views of its memory map (same bytes, no memmap
    ``__getitem__`` per field part), built once per (path, mode) while ``fast_gguf_reference`` is active."""
    import gguf

    class ParsedOnceReader(gguf.GGUFReader):
        _readers: dict[tuple[str, str], "ParsedOnceReader"] = {}

        def __new__(cls, path, mode="r"):
            key = (str(path), mode)
            if key not in cls._readers:
                reader = super().__new__(cls)
                reader._initialised = False
                cls._readers[key] = reader
            return cls._readers[key]

        def __init__(self, path, mode="r"):
            if not self._initialised:
                super().__init__(path, mode)
                self._initialised = True

        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain_data")  # the map's ndarray view, made on the first read
            if plain is None:
                plain = self._plain_data = self.data.view(np.ndarray)
            count = int(count)
            end = offset + np.dtype(dtype).itemsize * count
            arr = plain[offset:end].view(dtype=dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return ParsedOnceReader


@contextmanager
def fast_gguf_reference() -> Iterator[None]:
    """Inside the block ``gguf.dequantize`` is ``fast_dequantize`` and ``gguf.GGUFReader`` parses each file once
    (transformers imports both at call time)."""
    import gguf

    originals = gguf.dequantize, gguf.GGUFReader
    gguf.dequantize, gguf.GGUFReader = fast_dequantize, parsed_once_reader_class()
    try:
        yield
    finally:
        gguf.dequantize, gguf.GGUFReader = originals


def transformers_gguf_model(name: str):
    """The transformers float32 model of a registry name's GGUF, in eval mode (2 torch threads)."""
    import torch
    from transformers import AutoModelForCausalLM

    from specrag_jax.models.loading.registry import resolve_model_path

    torch.set_num_threads(2)
    path = resolve_model_path(name)
    with fast_gguf_reference():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()
