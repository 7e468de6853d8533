"""tests/hf_gguf.py's reader stand-in: the same fields, parts and tensors as gguf-py's own reader, parsed once."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from specrag_jax.models.loading.registry import resolve_model_path
from tests.hf_gguf import fast_gguf_reference, parsed_once_reader_class


def assert_same_reader(mine: gguf.GGUFReader, theirs: gguf.GGUFReader) -> None:
    assert list(mine.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        got = mine.fields[name]
        assert (got.offset, got.types, got.data) == (field.offset, field.types, field.data), name
        assert len(got.parts) == len(field.parts), name
        for a, b in zip(got.parts, field.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        assert got.contents() == field.contents(), name
    assert len(mine.tensors) == len(theirs.tensors)
    for a, b in zip(mine.tensors, theirs.tensors):
        assert (a.name, a.tensor_type, a.data_offset, list(a.shape)) == (
            b.name,
            b.tensor_type,
            b.data_offset,
            list(b.shape),
        )
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert a.data.tobytes() == b.data.tobytes(), a.name


def test_tiny_file_with_every_value_kind(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("u32", 7)
    writer.add_float32("f32", -1.5)
    writer.add_bool("flag", True)
    writer.add_string("name", "ünïcode ▁ text")
    writer.add_array("tokens", ["a", "", "▁b", "<s>"])
    writer.add_array("scores", [0.5, -2.0])
    writer.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("h", np.arange(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = parsed_once_reader_class()
    assert_same_reader(reader(path), gguf.GGUFReader(path))
    assert reader(path) is reader(path)


@pytest.mark.slow
def test_real_gguf_reads_the_same_and_once_inside_the_block():
    path = resolve_model_path("smollm2-135m-instruct")
    theirs = gguf.GGUFReader(path)
    with fast_gguf_reference():
        first, second = gguf.GGUFReader(path), gguf.GGUFReader(path)
    assert first is second and gguf.GGUFReader is not type(first)  # the stand-in is gone after the block
    assert_same_reader(first, theirs)
