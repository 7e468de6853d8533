"""The fast dequantisers equal gguf-py's ``dequantize`` bit for bit, on random and adversarial blocks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.models.loading import dequant
from specrag_jax.models.loading.dequant import KERNELS, dequantize_rows

# Byte offsets of each type's float16 scale fields (d, dmin/m) inside a block.
F16_FIELDS = {
    QT.Q8_0: (0,),
    QT.Q4_0: (0,),
    QT.Q4_1: (0, 2),
    QT.Q5_0: (0,),
    QT.Q5_1: (0, 2),
    QT.Q4_K: (0, 2),
    QT.Q5_K: (0, 2),
    QT.Q6_K: (208,),
    QT.F16: (0,),
    QT.F32: (),
    QT.BF16: (),
}
# NaN, -NaN with a payload, +-inf, +-0, the largest and smallest normal, subnormals, 1, -2.
ADVERSARIAL_F16 = np.array(
    [0x7E00, 0xFC01, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x7BFF, 0x0400, 0x0001, 0x83FF, 0x3C00, 0xC000], np.uint16
)


def reference(raw: np.ndarray, qtype: QT) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(dequantize(raw, qtype), dtype=np.float32)


def fast(raw: np.ndarray, qtype: QT) -> np.ndarray:
    block, type_size = GGML_QUANT_SIZES[qtype]
    out = np.empty((raw.shape[0], raw.shape[1] // type_size * block), np.float32)
    with np.errstate(all="ignore"):
        dequantize_rows(raw, qtype, out)
    return out


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(
    qtype=st.sampled_from(sorted(KERNELS)),
    rows=st.integers(1, 4),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
    special=st.booleans(),
)
def test_random_blocks_match_gguf_bit_for_bit(qtype, rows, blocks, seed, special):
    rng = np.random.default_rng(seed)
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, blocks * type_size), dtype=np.uint8)
    if special:  # every scale field an adversarial float16; quant bytes all 0x00 or all 0xFF in some blocks
        cells = raw.reshape(rows * blocks, type_size)
        for at in F16_FIELDS[qtype]:
            cells[:, at : at + 2] = rng.choice(ADVERSARIAL_F16, size=len(cells))[:, None].view(np.uint8)
        cells[::2, max(F16_FIELDS[qtype], default=-2) + 2 :] = rng.choice([0, 255])
    assert_same_bits(fast(raw, qtype), reference(raw, qtype))


@pytest.mark.parametrize("qtype", sorted(KERNELS))
def test_every_float16_scale_matches(qtype):
    """All 65,536 float16 bit patterns as each scale field, with random quant bytes."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, size=(1 << 16, type_size), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        raw[:, at : at + 2] = rng.permutation(np.arange(1 << 16, dtype=np.uint16))[:, None].view(np.uint8)
    assert_same_bits(fast(raw.reshape(256, -1), qtype), reference(raw.reshape(256, -1), qtype))


def test_chunked_and_strided_input(monkeypatch):
    """Rows split over several chunks, and a column slice of whole blocks (not contiguous), change nothing."""
    monkeypatch.setattr(dequant, "CHUNK_BYTES", 4096)
    raw = np.random.default_rng(0).integers(0, 256, size=(37, 4 * 210), dtype=np.uint8)
    assert_same_bits(fast(raw, QT.Q6_K), reference(raw, QT.Q6_K))
    part = raw[:, 210:630]
    assert not part.flags.c_contiguous
    assert_same_bits(fast(part, QT.Q6_K), reference(np.ascontiguousarray(part), QT.Q6_K))


def test_bad_input_is_one_line_value_error():
    with pytest.raises(ValueError, match="do not make float32"):
        dequantize_rows(np.zeros((2, 100), np.uint8), QT.Q4_K, np.empty((2, 256), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        dequantize_rows(np.zeros((2, 34), np.uint8), QT.Q8_0, np.empty((32, 2), np.float32).T)
    with pytest.raises(ValueError, match="no dequantiser for GGML type Q2_K"):
        dequantize_rows(np.zeros((1, 84), np.uint8), QT.Q2_K, np.empty((1, 256), np.float32))


@pytest.mark.parametrize("qtype", sorted(KERNELS))
def test_gguf_shaped_wrapper_matches_gguf(qtype):
    """tests/hf_gguf.py's ``gguf.dequantize`` stand-in (transformers' reference models): same shapes, same bits."""
    from tests.hf_gguf import fast_dequantize

    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, size=(2, 3, 2 * type_size), dtype=np.uint8)
    assert_same_bits(fast_dequantize(raw, qtype), reference(raw, qtype))
    if qtype in (QT.F32, QT.F16):  # GGUFReader hands these over typed, not as bytes
        typed = raw.view(np.float32 if qtype == QT.F32 else np.float16)
        with np.errstate(all="ignore"):
            assert_same_bits(fast_dequantize(typed, qtype), reference(typed, qtype))
