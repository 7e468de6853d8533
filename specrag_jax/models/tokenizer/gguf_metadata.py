"""Fast reader for the tokenizer part of a GGUF header.

gguf.GGUFReader builds numpy views for every array element (~10 s for Gemma's 262,144-token vocabulary),
so the header is parsed with ``gguf_header.read_metadata`` (struct/numpy): only `general.architecture` and
`tokenizer.*` values are kept, other keys are skipped, and tensor data is never touched.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.gguf_header import read_metadata


def _wanted(key: str) -> bool:
    return key == "general.architecture" or key.startswith("tokenizer.")


def read_gguf_tokenizer_metadata(path: str | Path) -> dict[str, Any]:
    """`general.architecture` and every `tokenizer.*` key of a GGUF file (arrays as lists)."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            meta, _, _ = read_metadata(buf, str(path), _wanted)
            return {key: value for key, value in meta.items() if _wanted(key)}
    except SpecRagError:
        raise
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise SpecRagError(f"cannot read GGUF metadata from {path}: {exc}") from exc
