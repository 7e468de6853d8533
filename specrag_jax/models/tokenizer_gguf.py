"""Fast reader for the tokenizer part of a GGUF header.

gguf.GGUFReader builds numpy views for every array element (~10 s for Gemma's 262,144-token vocabulary),
so the header is parsed here directly with struct/numpy: only `general.architecture` and `tokenizer.*`
values are kept, other keys are skipped, and tensor data is never touched.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

from specrag_jax.errors import SpecRagError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
           10: "<u8", 11: "<i8", 12: "<f8"}


def read_gguf_tokenizer_metadata(path: str | Path) -> dict[str, Any]:
    """`general.architecture` and every `tokenizer.*` key of a GGUF file (arrays as lists)."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_metadata(buf, str(path))
    except SpecRagError:
        raise
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise SpecRagError(f"cannot read GGUF metadata from {path}: {exc}") from exc


def _parse_metadata(buf: mmap.mmap, path: str) -> dict[str, Any]:
    if buf[:4] != b"GGUF":
        raise SpecRagError(f"{path} is not a GGUF file (bad magic)")
    version, _tensors, count = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise SpecRagError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported")
    pos, out = 24, {}
    for _ in range(count):
        key, pos = _read_str(buf, pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        wanted = key == "general.architecture" or key.startswith("tokenizer.")
        value, pos = _read_value(buf, pos + 4, vtype, wanted)
        if wanted:
            out[key] = value
    return out


def _read_str(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + length
    return buf[pos + 8 : end].decode("utf-8", errors="replace"), end


def _read_value(buf: mmap.mmap, pos: int, vtype: int, keep: bool) -> tuple[Any, int]:
    if vtype in _SCALARS:
        return struct.unpack_from(_SCALARS[vtype], buf, pos)[0], pos + struct.calcsize(_SCALARS[vtype])
    if vtype == 8:
        return _read_str(buf, pos)
    if vtype != 9:
        raise ValueError(f"unknown GGUF value type {vtype}")
    etype, n = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _DTYPES:
        dtype = np.dtype(_DTYPES[etype])
        values = np.frombuffer(buf, dtype=dtype, count=n, offset=pos).tolist() if keep else None
        return values, pos + n * dtype.itemsize
    items = []
    for _ in range(n):
        if etype == 8 and not keep:
            pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        else:
            item, pos = _read_value(buf, pos, etype, keep)
            items.append(item)
    return (items if keep else None), pos
