"""Atomic index directories: write everything into a temp dir beside the target, then swap it in.

A reader never sees a half-written index: the new directory is complete (files flushed and fsync'd) before
it takes the target's name. POSIX cannot rename a directory over a non-empty one, so the swap is two
renames, ``target -> .target.old-*`` then ``tmp -> target``; if the process dies between them, the next
``resolve_index_dir`` finds the complete old index under its aside name and uses (and restores) it.
A failure while writing removes the temp dir and leaves the old index untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

from specrag_jax.errors import SpecRagError

META_NAME = "specrag_index.json"
FORMAT_VERSION = 1


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _aside_dirs(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.old-*"))


def atomic_write_dir(path: str | os.PathLike, kind: str, meta: dict[str, Any], write: Callable[[Path], None]) -> Path:
    """Create or replace the index directory ``path``: ``write(tmp_dir)`` fills it, then it is swapped in.

    ``kind`` and ``meta`` go into the directory's metadata file (written last). An existing ``path`` that is
    not a specrag index is never overwritten.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise SpecRagError(f"cannot write an index to {path}: it exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / META_NAME).is_file():
        raise SpecRagError(f"refusing to overwrite {path}: it is not empty and holds no specrag index")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=parent))
    except OSError as exc:
        raise SpecRagError(f"cannot write an index to {path}: {exc.strerror or exc}") from exc
    try:
        write(tmp)
        with open(tmp / META_NAME, "w", encoding="utf-8") as f:
            json.dump({"kind": kind, "format_version": FORMAT_VERSION, **meta}, f, indent=1)
        _fsync_tree(tmp)
        if path.exists():
            aside = parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, aside)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(aside, path)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(tmp, path)
        _fsync_dir(parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise SpecRagError(f"cannot write an index to {path}: {exc.strerror or exc}") from exc
        raise
    return path


def resolve_index_dir(path: str | os.PathLike, kind: str) -> tuple[Path, dict[str, Any]]:
    """The directory holding the ``kind`` index at ``path`` and its metadata (recovers an interrupted swap)."""
    path = Path(path).expanduser()
    if not path.exists():
        asides = [a for a in _aside_dirs(path) if (a / META_NAME).is_file()]
        if not asides:
            raise SpecRagError(f"no index at {path}")
        try:  # a swap was interrupted between its two renames: put the complete old index back
            os.rename(asides[-1], path)
        except OSError:
            path = asides[-1]
    meta_path = path / META_NAME
    if not meta_path.is_file():
        raise SpecRagError(f"{path} is not a specrag index (no {META_NAME})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecRagError(f"unreadable index metadata {meta_path}: {exc}") from exc
    if meta.get("kind") != kind:
        raise SpecRagError(f"{path} holds a {meta.get('kind')!r} index, not a {kind!r} one")
    if meta.get("format_version") != FORMAT_VERSION:
        raise SpecRagError(
            f"{path}: index format {meta.get('format_version')} is not supported "
            f"(expected {FORMAT_VERSION}); rebuild it"
        )
    return path, meta
