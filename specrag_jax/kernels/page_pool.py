"""KV page pool layout and a reference-counted page allocator.

Pool layout: per layer, K and V are each ``[num_pages, page_size, num_kv_heads, head_dim]`` (one buffer
per layer, so a layer reads and writes its pages without slicing a larger array). Page 0 is a
reserved *null page*: never handed out, used to pad page tables, never read unmasked. A flat slot is
``page * page_size + offset``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specrag_jax.errors import SpecRagError

NULL_PAGE = 0


class PoolExhausted(SpecRagError):
    """Raised when an allocation cannot be satisfied; nothing is allocated in that case."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVPool:
    """The K and V page pools of all layers (tuples of per-layer arrays; a pytree donated to jitted steps)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def num_pages(self) -> int:
        return int(self.k[0].shape[0])

    @property
    def page_size(self) -> int:
        return int(self.k[0].shape[1])


def make_pool(
    num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, dtype=jnp.float32
) -> KVPool:
    """Zero-filled pool (page 0 included as the null page)."""
    if num_pages < 2 or page_size < 1:
        raise SpecRagError(f"a KV pool needs >= 2 pages and page_size >= 1 (got {num_pages}, {page_size})")
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    return KVPool(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
    )


class PageAllocator:
    """Host-side allocator with reference counts, so shared prefixes can be shared pages."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._refcount = np.zeros(num_pages, np.int32)
        self._free = list(range(num_pages - 1, NULL_PAGE, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_usable(self) -> int:
        return self.num_pages - 1

    def refcount(self, page: int) -> int:
        return int(self._refcount[page])

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` fresh pages (refcount 1); all or nothing."""
        if n < 0:
            raise SpecRagError(f"cannot allocate a negative number of pages ({n})")
        if n > len(self._free):
            raise PoolExhausted(f"KV pool exhausted: need {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        self._refcount[pages] = 1
        return pages

    def retain(self, pages: list[int]) -> None:
        """Add one reference to each page (sharing a prefix)."""
        for p in pages:
            if self._refcount[p] <= 0:
                raise SpecRagError(f"retain of page {p}, which is not allocated")
            self._refcount[p] += 1

    def release(self, pages: list[int]) -> None:
        """Drop one reference from each page; pages reaching zero return to the pool."""
        for p in pages:
            if self._refcount[p] <= 0:
                raise SpecRagError(f"release of page {p}, which is not allocated")
            self._refcount[p] -= 1
            if self._refcount[p] == 0:
                self._free.append(p)


def pages_needed(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


def slots_for(pages: list[int], start: int, count: int, page_size: int) -> np.ndarray:
    """Flat pool slots of logical positions ``start .. start+count-1`` of a sequence owning ``pages``."""
    logical = np.arange(start, start + count)
    page_ids = np.asarray(pages, np.int64)[logical // page_size]
    return (page_ids * page_size + logical % page_size).astype(np.int32)
