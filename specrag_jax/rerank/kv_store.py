"""Documents' prefix K/V on disk: one safetensors file per (model, weights, dtype, document, token limit).

Layout: ``<directory>/<model>-<dtype>-<weights fingerprint>/<digest>.safetensors`` holding tensors ``k`` and
``v`` (``[layers, tokens, kv_heads, head_dim]``, in the pool's dtype, so float32 models store float32 and a
reload is bit-exact) and ``__metadata__`` = the entry's full key (JSON) and a CRC-32 of the tensor bytes. The
digest is a hash of the key: model name, weights fingerprint, dtype, K/V shape, the document text's SHA-256,
the token limit, the prompt's fingerprint and the prefix token ids' hash. An edited document, another
model, other weights or another dtype make another key, so a stale entry is never read. Files are written
to a temporary name, fsynced and renamed into place (``os.replace``), so a reader (or a killed writer) never
leaves a half-written entry; reads are memory-mapped. A truncated or corrupt file (size, header, key or CRC
mismatch) is reported with a warning, deleted and treated as missing (the caller recomputes and rewrites).
Bytes per document token: ``2 * layers * kv_heads * head_dim * itemsize`` plus a ~1 KB header per file
(SmolLM2-135M float32: 46,080; Gemma 3 270M float32: 36,864).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
import warnings
import weakref
import zlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from specrag_jax.cache_root import cache_root
from specrag_jax.errors import SpecRagError

FORMAT = 1  # bump when the prompt, layout or key changes
_DTYPES = {"F32": np.dtype(np.float32), "BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16)}
_NAMES = {v: k for k, v in _DTYPES.items()}
_ALIGN = 64
_FINGERPRINTS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def default_store_dir() -> Path:
    """``<cache root>/doc_kv`` (``$SPECRAG_CACHE_DIR`` or ``~/.cache/specrag_jax``)."""
    return cache_root() / "doc_kv"


def weights_fingerprint(runner) -> str:
    """SHA-256 over the config and, per parameter, its path, shape, dtype and a strided sample of at least
    4,096 values (every value of small tensors); computed once per runner."""
    if runner in _FINGERPRINTS:
        return _FINGERPRINTS[runner]
    import jax

    h = hashlib.sha256(repr(runner.cfg).encode())
    leaves = jax.tree_util.tree_flatten_with_path(runner.params)[0]
    for path, leaf in sorted(leaves, key=lambda pl: jax.tree_util.keystr(pl[0])):
        a = np.asarray(leaf).reshape(-1)
        stride = max(1, a.size // 4096)
        h.update(f"{jax.tree_util.keystr(path)}{leaf.shape}{leaf.dtype}".encode())
        h.update(np.ascontiguousarray(a[::stride]).tobytes())
    _FINGERPRINTS[runner] = h.hexdigest()
    return _FINGERPRINTS[runner]


def write_atomic(path: Path, data_writer) -> None:
    """Call ``data_writer(fh)`` on a temporary sibling, fsync, and rename it to ``path``."""
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as fh:
            data_writer(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> int:
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, a in tensors.items():
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)

    def write(fh) -> None:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for a in tensors.values():
            fh.write(np.ascontiguousarray(a).tobytes())

    write_atomic(path, write)
    return 8 + len(raw) + offset


class CorruptEntry(ValueError):
    """A store file that does not check out (truncated, unparseable, wrong key, CRC mismatch)."""


def _read_safetensors(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray], np.memmap]:
    """Metadata, memory-mapped tensors and the data region of a safetensors file; CorruptEntry if malformed."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CorruptEntry("shorter than a header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 1 << 20):
            raise CorruptEntry(f"header length {n} is past the end of the file")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptEntry(f"unreadable header ({exc})") from None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__", {}), dict):
        raise CorruptEntry("malformed header")
    meta = header.pop("__metadata__", None) or {}
    data = np.memmap(path, dtype=np.uint8, mode="r")[8 + n :]
    tensors, end = {}, 0
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            start, stop = (int(x) for x in info["data_offsets"])
            shape = tuple(int(x) for x in info["shape"])
        except (KeyError, TypeError, ValueError):
            raise CorruptEntry(f"tensor {name} is malformed") from None
        if not 0 <= start <= stop <= data.size or stop - start != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise CorruptEntry(f"tensor {name} is truncated or malformed")
        tensors[name] = data[start:stop].view(dtype).reshape(shape)
        end = max(end, stop)
    if end != data.size:
        raise CorruptEntry(f"{data.size - end} bytes past the last tensor")
    return meta, tensors, data


class DocKVStore:
    """Stored prefix K/V of documents for one model (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike | None, model) -> None:
        runner = model.runner
        cfg = runner.cfg
        self.model_key = {
            "format": FORMAT,
            "model": str(model.name),
            "weights": weights_fingerprint(runner),
            "dtype": runner.dtype,
            "layers": cfg.num_layers,
            "kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
        }
        slug = "".join(c if c.isalnum() or c in "-._" else "_" for c in Path(str(model.name)).name)[:60]
        root = Path(directory).expanduser() if directory is not None else default_store_dir()
        self.directory = root / f"{slug}-{runner.dtype}-{self.model_key['weights'][:12]}"
        self.dtype = np.dtype(runner.pool.k[0].dtype)
        self.corrupt = 0  # entries found bad and deleted (this process)
        self.bytes_written = 0

    def key(self, text_sha256: str, max_doc_tokens: int, prompt: str, prefix_ids) -> dict[str, Any]:
        ids = np.asarray(prefix_ids, np.int64)
        return {
            **self.model_key,
            "text_sha256": text_sha256,
            "max_doc_tokens": int(max_doc_tokens),
            "prompt": prompt,
            "prefix_sha256": hashlib.sha256(ids.tobytes()).hexdigest(),
            "tokens": len(ids),
        }

    def path(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        return self.directory / f"{digest}.safetensors"

    def _shape(self, key: dict[str, Any]) -> tuple[int, ...]:
        return (key["layers"], key["tokens"], key["kv_heads"], key["head_dim"])

    def _open(self, path: Path, key: dict[str, Any], verify: bool) -> tuple[np.ndarray, np.ndarray]:
        meta, tensors, data = _read_safetensors(path)
        if meta.get("key") != json.dumps(key, sort_keys=True):
            raise CorruptEntry("its key differs from the document's")
        k, v = tensors.get("k"), tensors.get("v")
        shape = self._shape(key)
        if k is None or v is None or k.shape != shape or v.shape != shape or k.dtype != self.dtype:
            raise CorruptEntry(f"tensors are not k/v of shape {shape} {self.dtype}")
        if verify and str(zlib.crc32(data)) != meta.get("crc32"):
            raise CorruptEntry("CRC-32 mismatch")
        return k, v

    def load(self, key: dict[str, Any], *, verify: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """Memory-mapped (k, v) of an entry, or None if absent; a bad file is warned about, deleted, None."""
        path = self.path(key)
        try:
            return self._open(path, key, verify)
        except FileNotFoundError:
            return None
        except (CorruptEntry, OSError) as exc:
            self._drop(path, exc)
            return None

    def has(self, key: dict[str, Any]) -> bool:
        """Whether a well-formed entry exists (size, header and key checked; the CRC is checked on load)."""
        return self.load(key, verify=False) is not None

    def _drop(self, path: Path, exc: Exception) -> None:
        warnings.warn(f"document K/V store: {path.name} is unusable ({exc}); recomputing it", stacklevel=3)
        self.corrupt += 1
        path.unlink(missing_ok=True)

    def save(self, key: dict[str, Any], k: np.ndarray, v: np.ndarray) -> int:
        """Write an entry atomically; returns its size in bytes."""
        shape = self._shape(key)
        if k.shape != shape or v.shape != shape:
            raise SpecRagError(f"K/V of shape {k.shape} do not match the entry's {shape}")
        k = np.ascontiguousarray(k, self.dtype)
        v = np.ascontiguousarray(v, self.dtype)
        crc = zlib.crc32(v.reshape(-1).view(np.uint8), zlib.crc32(k.reshape(-1).view(np.uint8)))
        self.directory.mkdir(parents=True, exist_ok=True)
        size = _write_safetensors(
            self.path(key), {"k": k, "v": v}, {"key": json.dumps(key, sort_keys=True), "crc32": str(crc)}
        )
        self.bytes_written += size
        return size

    def bytes_per_token(self) -> int:
        """K and V bytes per document token (headers excluded)."""
        m = self.model_key
        return 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * self.dtype.itemsize

    def write_manifest(self, name: str, summary: dict[str, Any]) -> Path:
        """Write ``<name>.json`` (an index run's summary) next to the entries, atomically."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.json"
        text = json.dumps({"model_key": self.model_key, **summary}, indent=1, sort_keys=True).encode()
        write_atomic(path, lambda fh: fh.write(text))
        return path
