"""Place parameters straight into their target sharding, a bounded chunk at a time, never whole on the host.

``place(shape, dtype, sharding, read)`` builds one global array from a source that can read any block of it
(``read(index)`` -> host array; e.g. a slice of a memory-mapped safetensors tensor). Each device gets zeros of
its own shard's shape, filled in place: a chunk of at most ``CHUNK_BYTES`` of that shard is read on the host,
put on that device and written with a jitted, donated ``dynamic_update_slice``. So the host holds about one
chunk at a time (not a tensor, not a stacked ``[L, ...]`` leaf, not the model) and a device only ever receives
its own part; the per-device buffers become one array with ``jax.make_array_from_single_device_arrays``. A
shard no larger than a chunk is read and put in one piece. Without a sharding the array goes to the default
device uncommitted, exactly as ``jax.device_put`` of the whole host array would (same bits: the host cast to
``dtype`` is the same numpy ``astype``).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.loading.params import flatten_tree

# Host bytes per chunk (one device_put and one in-place update each). 4 MiB: the 1.4 GB float32 checkpoint of
# benchmarks/load_memory.py loads with ~70 MB over the model at peak and no slower than with 16 MiB, where
# glibc kept several freed chunk buffers and the peak was ~180 MB over.
CHUNK_BYTES = 4 << 20

Index = tuple[slice, ...]  # explicit start/stop per axis, step 1
Reader = Callable[[Index], np.ndarray]
ShardingsFn = Callable[[ModelConfig, Any], Any]  # (cfg, abstract tree) -> a Sharding per leaf


def full_index(shape: Sequence[int]) -> Index:
    """The index selecting all of an array of ``shape``."""
    return tuple(slice(0, n) for n in shape)


def _normalize(index: Index, shape: Sequence[int]) -> Index:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))


def chunk_slices(
    shape: Sequence[int], itemsize: int, order: Sequence[int] | None = None, limit: int | None = None
) -> Iterator[Index]:
    """Blocks tiling ``shape``, each at most ``max(limit, itemsize)`` bytes (default ``CHUNK_BYTES``).

    ``order``: the axes from outermost to innermost in the source's memory order (default C order). A block keeps
    the axes after its split axis whole and takes the axes before it one index at a time, so it is a run of
    whole inner rows of the source (contiguous on disk when the source is stored in that order)."""
    limit = CHUNK_BYTES if limit is None else limit
    order = list(range(len(shape))) if order is None else list(order)
    if not shape:
        yield ()
        return
    if 0 in shape:
        return
    p, inner = len(order) - 1, itemsize
    while p > 0 and inner * shape[order[p]] <= limit:
        inner *= shape[order[p]]
        p -= 1
    split = order[p]
    step = max(1, min(shape[split], limit // inner))
    for outer in itertools.product(*(range(shape[a]) for a in order[:p])):
        for start in range(0, shape[split], step):
            index = [slice(0, n) for n in shape]
            for axis, i in zip(order[:p], outer):
                index[axis] = slice(i, i + 1)
            index[split] = slice(start, min(start + step, shape[split]))
            yield tuple(index)


@functools.partial(jax.jit, donate_argnums=0)
def _write(buf: jax.Array, block: jax.Array, starts: jax.Array) -> jax.Array:
    """``buf`` with ``block`` written at ``starts`` (in place: ``buf`` is donated)."""
    return jax.lax.dynamic_update_slice(buf, block, tuple(starts[k] for k in range(buf.ndim)))


def _host(block: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], index: Index) -> np.ndarray:
    block = np.asarray(block).astype(dtype, copy=False)
    if block.shape != shape:
        raise SpecRagError(f"source block for {index} has shape {block.shape}, expected {shape}")
    return block


def _fill(
    device: jax.Device | None, index: Index, dtype: np.dtype, read: Reader, order: Sequence[int] | None
) -> jax.Array:
    """One device's shard (``index`` of the global array) from chunks of ``read``."""
    shape = tuple(s.stop - s.start for s in index)
    if math.prod(shape) * dtype.itemsize <= CHUNK_BYTES:
        return jax.device_put(_host(read(index), dtype, shape, index), device).block_until_ready()
    buf = jnp.zeros(shape, dtype, device=device)
    for local in chunk_slices(shape, dtype.itemsize, order):
        glob = tuple(slice(s.start + c.start, s.start + c.stop) for s, c in zip(index, local))
        block = _host(read(glob), dtype, tuple(c.stop - c.start for c in local), glob)
        starts = np.array([c.start for c in local], np.int32)
        buf = _write(buf, jax.device_put(block, device), starts).block_until_ready()
        del block
    return buf


def place(
    shape: Sequence[int], dtype: Any, sharding: Sharding | None, read: Reader, order: Sequence[int] | None = None
) -> jax.Array:
    """A ``shape`` array of ``dtype`` with ``sharding`` (None: the default device, uncommitted) whose values are
    ``read(index)`` (host blocks of any float dtype, cast here); ``order`` as in ``chunk_slices``."""
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    if sharding is None:
        return _fill(None, full_index(shape), dtype, read, order)
    targets = sharding.addressable_devices_indices_map(shape)
    arrays = [_fill(device, _normalize(index, shape), dtype, read, order) for device, index in targets.items()]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def kernel_order(ndim: int) -> tuple[int, ...]:
    """Source memory order of a matrix leaf stored transposed (``[.., out, in]`` on disk, ``[.., in, out]`` here)."""
    return (*range(ndim - 2), ndim - 1, ndim - 2) if ndim >= 2 else tuple(range(ndim))


def flat_shardings(fn: ShardingsFn | None, cfg: ModelConfig, abstract: Any) -> dict[str, Sharding]:
    """``fn(cfg, abstract)`` flattened to ``{"layers/attn/q/kernel": sharding}`` (empty without ``fn``)."""
    if fn is None:
        return {}
    return flatten_tree(fn(cfg, abstract))
