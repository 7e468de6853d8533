"""Fast GGML dequantisation into caller-owned float32 buffers, bit-exact with ``gguf.quants.dequantize``.

gguf-py's dequantisers build several whole-tensor float32 temporaries per call (14x slower on Qwen2.5's Q4_K
matrices). Here each kernel writes a block range straight into ``out`` and does the same float32 operations in
the same order (e.g. Q4_K: ``(d * sc) * q - dmin * m``, every product rounded to float32, no fused multiply-add),
so results are equal bit for bit; ``dequantize_rows`` runs them over a few hundred KiB at a time so the passes
stay in cache. Raw data is ``uint8 [rows, row_bytes]`` (whole blocks per row, as GGUF stores it).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
CHUNK_BYTES = 256 << 10  # float32 output per step: small enough for the passes to stay in L2

Kernel = Callable[[np.ndarray, np.ndarray], None]  # (blocks uint8 [n, type_size], out float32 [n, block_size])


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of every block, as float32 ``[n, 1]``."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, out: np.ndarray) -> None:
    """``qs [n, g, w]`` bytes -> ``out [n, g, 2, w]``: low nibbles, then high nibbles (ggml's order)."""
    out[:, :, 0] = qs & np.uint8(0x0F)
    out[:, :, 1] = qs >> np.uint8(4)


def _f32(blocks: np.ndarray, out: np.ndarray) -> None:
    out[...] = blocks.view(np.float32)


def _f16_rows(blocks: np.ndarray, out: np.ndarray) -> None:
    out[...] = blocks.view(np.float16)


def _bf16(blocks: np.ndarray, out: np.ndarray) -> None:
    out.view(np.uint32)[...] = blocks.view(np.uint16).astype(np.uint32) << np.uint32(16)


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    out[...] = blocks[:, 2:].view(np.int8)
    out *= _f16(blocks, 0)


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    _nibbles(blocks[:, 2:].reshape(n, 1, 16), out.reshape(n, 1, 2, 16))
    out -= np.float32(8)
    out *= _f16(blocks, 0)


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    _nibbles(blocks[:, 4:].reshape(n, 1, 16), out.reshape(n, 1, 2, 16))
    out *= _f16(blocks, 0)
    out += _f16(blocks, 2)


def _q5_high(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: bit ``j`` of the little-endian uint32 ``qh`` is bit 4 of element ``j`` -> uint8 ``[n, 32]``."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")
    return bits << np.uint8(4)


def _q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    _nibbles(blocks[:, 6:].reshape(n, 1, 16), out.reshape(n, 1, 2, 16))
    out += _q5_high(blocks[:, 2:6])
    out -= np.float32(16)
    out *= _f16(blocks, 0)


def _q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    _nibbles(blocks[:, 8:].reshape(n, 1, 16), out.reshape(n, 1, 2, 16))
    out += _q5_high(blocks[:, 4:8])
    out *= _f16(blocks, 0)
    out += _f16(blocks, 2)


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: the 8 sub-block scales ``d * sc`` and mins ``dmin * m`` (float32 ``[n, 8, 1]``)."""
    n = len(blocks)
    s = blocks[:, 4:16].reshape(n, 3, 4)
    a, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([a & 0x3F, (md & 0x0F) | ((a >> 2) & 0x30)], axis=-1).astype(np.float32)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1).astype(np.float32)
    return (_f16(blocks, 0) * sc)[:, :, None], (_f16(blocks, 2) * mn)[:, :, None]


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    scale, low = _k_scales(blocks)
    _nibbles(blocks[:, 16:].reshape(n, 4, 32), out.reshape(n, 4, 2, 32))
    o = out.reshape(n, 8, 32)
    o *= scale
    o -= low


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    scale, low = _k_scales(blocks)
    _nibbles(blocks[:, 48:].reshape(n, 4, 32), out.reshape(n, 4, 2, 32))
    qh = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    o = out.reshape(n, 8, 32)
    o += (qh & np.uint8(1)) << np.uint8(4)
    o *= scale
    o -= low


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    scale = _f16(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    q = np.empty((n, 2, 2, 2, 32), np.uint8)  # [half, low/high nibble, 32-column group, 32]
    ql = blocks[:, :128].reshape(n, 2, 1, 2, 32)
    q[:, :, 0:1] = ql & np.uint8(0x0F)
    q[:, :, 1:2] = ql >> np.uint8(4)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q |= ((qh & np.uint8(3)) << np.uint8(4)).reshape(n, 2, 2, 2, 32)
    o = out.reshape(n, 16, 16)
    o[...] = q.reshape(n, 16, 16).view(np.int8)
    o -= np.float32(32)
    o *= scale[:, :, None]


KERNELS: dict[GGMLQuantizationType, Kernel] = {
    Q.F32: _f32,
    Q.F16: _f16_rows,
    Q.BF16: _bf16,
    Q.Q8_0: _q8_0,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}
SUPPORTED = frozenset(KERNELS)


def dequantize_rows(raw: np.ndarray, qtype: GGMLQuantizationType, out: np.ndarray) -> None:
    """Dequantise ``raw`` (uint8 ``[rows, row_bytes]``, whole blocks per row) into float32 ``out [rows, cols]``."""
    if qtype not in KERNELS:
        raise ValueError(f"no dequantiser for GGML type {qtype.name}")
    block, type_size = GGML_QUANT_SIZES[qtype]
    rows, row_bytes = raw.shape
    if row_bytes % type_size or out.shape != (rows, row_bytes // type_size * block) or out.dtype != np.float32:
        raise ValueError(f"{qtype.name}: {raw.shape} bytes do not make float32 {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError("the output must be C-contiguous")
    kernel = KERNELS[qtype]
    step = max(1, CHUNK_BYTES // max(1, out.shape[1] * 4))
    with np.errstate(all="ignore"):  # NaN/inf scales give NaN/inf, as in ggml, without warnings
        for r0 in range(0, rows, step):
            blocks = np.ascontiguousarray(raw[r0 : r0 + step]).reshape(-1, type_size)
            kernel(blocks, out[r0 : r0 + step].reshape(-1, block))
