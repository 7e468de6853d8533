"""Model steps kept on disk as exported StableHLO (``jax.export``), so a new process does not trace them again.

JAX's persistent compilation cache stores compiled programs, but a new process must still trace and lower
every step function before it can look one up: for the unrolled 28-30 layer decoders that is 0.3-0.5 s per
program (4 s of a second ``specrag ask``). Here each step (kind, static arguments, argument shapes) is
exported once, serialised next to the compilation cache, and later processes deserialise it and call it
under ``jax.jit`` with the same donation, which only has to lower a call to the stored module. Outputs are
bit-identical to the traced step (tested). The entry key holds the code (a hash of every source file under
``specrag_jax/models`` and ``specrag_jax/kernels``), the JAX version, the platform, the static arguments and
every input's shape and dtype, so a stale entry is never used. Active only while a persistent compilation
cache is set (the CLI and ``specrag serve`` set one); ``SPECRAG_EXPORT_CACHE=off`` disables it, a folder
path moves it. Any failure to export or load falls back to the traced step, once per step shape. Steps with
the Pallas kernels are not exported (their TPU/Triton custom calls would need export's safety checks off).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import uuid
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.executor.step_prefetch import MISSING, AheadLoader, RecentSteps

ENV = "SPECRAG_EXPORT_CACHE"
_PACKAGES = ("models", "kernels")
_held: list[int | None] = [None]  # compiled programs kept per model (``held_programs``)


def export_dir() -> Path | None:
    """Where exported steps live, or None when off (no persistent compilation cache, or ``$SPECRAG_EXPORT_CACHE``
    is "off"/"0")."""
    value = os.environ.get(ENV, "")
    if value.lower() in ("off", "0", "none", "false"):
        return None
    if value:
        return Path(value).expanduser()
    xla = jax.config.jax_compilation_cache_dir
    return Path(xla).expanduser().with_name(Path(xla).name + "_exported") if xla else None


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the decoder and kernel sources and the JAX version: any change makes new entries."""
    root = Path(__file__).resolve().parents[2]  # specrag_jax/
    digest = hashlib.sha256(f"jax {jax.__version__}".encode())
    for path in source_files():
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def source_files() -> list[Path]:
    """Every source file the fingerprint hashes: all of ``specrag_jax/models`` and ``specrag_jax/kernels``,
    subpackages included."""
    root = Path(__file__).resolve().parents[2]
    return [path for package in _PACKAGES for path in sorted((root / package).rglob("*.py"))]


def _signature(leaves: list[Any]) -> str:
    return ";".join(f"{np.dtype(x.dtype).name}{tuple(np.shape(x))}" for x in leaves)


@contextlib.contextmanager
def held_programs(limit: int | None) -> Iterator[None]:
    """Within the block, keep at most ``limit`` compiled step programs per model in memory (None: every program
    used, the default outside).

    An unrolled-layer step program holds about 80 MB of machine code and buffers on this CPU (measured: 25
    programs of the default pair, 2.0 GB), and a long offline run meets a new token bucket every few questions,
    so an eval over 100 questions grew to 22.6 GB. With a limit the least recently used program is dropped and,
    if needed again, loaded again from JAX's persistent cache (0.3-2 s, counted as compile time), not
    compiled. A server keeps the default: its warm-up compiles exactly the programs it will run."""
    if limit is not None and limit < 1:
        raise SpecRagError(f"held step programs must be at least 1, got {limit}")
    before, _held[0] = _held[0], limit
    try:
        yield
    finally:
        _held[0] = before


class ExportedSteps:
    """One runner's steps, each exported once and called through a jit with the pool donated."""

    def __init__(self, directory: Path, params: Any, pool: Any, platform: str) -> None:
        self.directory = directory
        self.platform = platform
        self._params, params_leaves = params, jax.tree_util.tree_leaves(params)
        self._params_leaves = params_leaves  # flattened once: the runner's parameters do not change
        self._n_params = len(params_leaves)
        self._n_pool = len(jax.tree_util.tree_leaves(pool))
        self._pool_treedef = jax.tree_util.tree_structure(pool)
        self._fixed = hashlib.sha256(_signature(params_leaves + jax.tree_util.tree_leaves(pool)).encode()).hexdigest()
        self._sharding = getattr(params_leaves[0], "sharding", None) if params_leaves else None
        self._names: dict[Any, str] = {}  # step key -> its file's name
        # file name -> the jitted call (None: trace the step instead), least recently used first
        self._fns: OrderedDict[str, Callable | None] = OrderedDict()
        # per model (parameter and pool shapes) and code version: another version's steps are other files
        self.recent = RecentSteps(directory / f"recent-{platform}-{self._fixed[:12]}-{code_fingerprint()[:12]}.json")
        self._ahead = AheadLoader()

    def prefetch(self, limit: int) -> None:
        """Start loading (lowering and compiling from the persistent cache) up to ``limit`` of the stored steps
        this model used most recently, on a background thread (``step_prefetch``)."""
        entries = [e for e in self.recent.entries[:limit] if (self.directory / e[0]).is_file()]
        committed = {name: placed for name, placed, _ in entries}
        self._ahead.start([(name, at) for name, _, at in entries], lambda n: self._compile_stored(n, committed[n]))

    def _compile_stored(self, name: str, committed: str) -> Callable:
        """The jitted call of a stored step, compiled for inputs placed as a call will place them (parameters and
        pool on the device; each step input committed or not as ``committed`` says), so the call reuses it."""
        exported = jax.export.deserialize(bytearray((self.directory / name).read_bytes()))
        fixed = self._n_params + self._n_pool
        if len(exported.in_avals) != fixed + len(committed):
            raise ValueError(f"{name}: {len(exported.in_avals)} inputs, the record has {fixed + len(committed)}")
        placed = [True] * fixed + [c == "c" for c in committed]
        specs = [
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self._sharding if on else None)
            for a, on in zip(exported.in_avals, placed)
        ]
        fn = jax.jit(exported.call, donate_argnums=self._donated())
        fn.lower(*specs).compile()
        return fn

    def _name(self, key: Any) -> str:
        name = self._names.get(key)
        if name is None:
            digest = hashlib.sha256(repr((key, self._fixed, self.platform, code_fingerprint())).encode()).hexdigest()
            name = self._names[key] = f"{key[0]}-{digest[:32]}.jaxexport"
        return name

    def call(self, kind: str, body: Callable, n_out: int, statics: dict, params: Any, pool: Any, args: tuple):
        """``body(params, pool, *args, **statics)`` -> ``(*outs, pool)``, through the stored export when possible."""
        arg_leaves, arg_tree = jax.tree_util.tree_flatten(args)
        key = (
            kind,
            tuple(sorted(statics.items())),
            arg_tree,
            tuple((np.shape(x), np.dtype(x.dtype)) for x in arg_leaves),
        )
        name = self._name(key)
        fn = self._fns.get(name, MISSING)
        if fn is MISSING:
            fn = self._ahead.take(name)  # loaded ahead, or MISSING (load it here)
            if fn is MISSING or fn is None:
                fn = self._load_or_export(name, body, statics, params, pool, args)
            self._fns[name] = fn
            if fn is not None:
                self.recent.used(name, "".join("c" if getattr(x, "committed", False) else "u" for x in arg_leaves))
            self._drop_least_recent()
        elif _held[0] is not None:
            self._fns[name] = self._fns.pop(name, fn)  # now the most recently used
        if fn is None:
            return None
        params_leaves = self._params_leaves if params is self._params else jax.tree_util.tree_leaves(params)
        leaves = params_leaves + jax.tree_util.tree_leaves(pool) + arg_leaves
        out = fn(*leaves)
        return (*out[:n_out], jax.tree_util.tree_unflatten(self._pool_treedef, list(out[n_out:])))

    def _drop_least_recent(self) -> None:
        """Free the least recently used programs beyond ``held_programs``'s limit (loaded again if needed)."""
        while _held[0] is not None and len(self._fns) > _held[0]:
            try:
                self._fns.popitem(last=False)
            except KeyError:  # another thread emptied it meanwhile
                return

    def _donated(self) -> tuple[int, ...]:
        return tuple(range(self._n_params, self._n_params + self._n_pool))

    def _load_or_export(self, name, body, statics, params, pool, args) -> Callable | None:
        path = self.directory / name
        try:
            if path.is_file():
                exported = jax.export.deserialize(bytearray(path.read_bytes()))
            else:
                exported = self._export(body, statics, params, pool, args)
                self.directory.mkdir(parents=True, exist_ok=True)
                # unique per writer: two threads of one process (engines on threads) may export the same step
                tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
                tmp.write_bytes(exported.serialize())
                os.replace(tmp, path)
            return jax.jit(exported.call, donate_argnums=self._donated())
        except Exception as exc:  # a missing serializer, an unexportable op, a corrupt file: trace as usual
            warnings.warn(
                f"step {name.split('-')[0]} not exported ({type(exc).__name__}: {str(exc)[:120]}); tracing it instead",
                stacklevel=2,
            )
            return None

    def _export(self, body, statics, params, pool, args) -> jax.export.Exported:
        treedef = jax.tree_util.tree_structure((params, pool, args))

        def flat(*leaves):
            p, kv, rest = jax.tree_util.tree_unflatten(treedef, leaves)
            *outs, kv = body(p, kv, *rest, **statics)
            return (*outs, *jax.tree_util.tree_leaves(kv))

        leaves = jax.tree_util.tree_leaves((params, pool, args))
        specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]
        return jax.export.export(jax.jit(flat, donate_argnums=self._donated()), platforms=[self.platform])(*specs)
