"""Block sizes for the Pallas tree-attention kernel, one small table per backend.

``q``: query tokens per block; ``chunk``: step (chunk) keys per block; ``kv``: prefix keys per block (a
whole number of pages: ``pages_per_block = max(1, kv // page_size)``).

- ``tpu``: 128 keeps the score tile lane-dense ([g*128, 128]) and each K/V DMA a few KiB per page.
- ``gpu``: Triton needs powers of two; 64x64 tiles keep registers in check for head_dim 256.
- ``cpu``: interpret mode on CPU (tests); small blocks = more skipping visible in small cases.
"""

from __future__ import annotations

import dataclasses

from specrag_jax.errors import SpecRagError

TREE_BLOCK_SIZES: dict[str, dict[str, int]] = {
    "tpu": {"q": 128, "chunk": 128, "kv": 128},
    "gpu": {"q": 64, "chunk": 64, "kv": 64},
    "cpu": {"q": 16, "chunk": 16, "kv": 16},
}


@dataclasses.dataclass(frozen=True)
class TreeBlocks:
    """Concrete (static) block sizes for one call."""

    q: int
    chunk: int
    pages_per_block: int
    page_size: int

    @property
    def kv(self) -> int:
        return self.pages_per_block * self.page_size


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def choose_blocks(table: str, num_tokens: int, page_size: int, overrides: dict[str, int] | None = None) -> TreeBlocks:
    """Pick block sizes from the table; query/chunk blocks shrink (to a power of two, >= 16) for tiny steps."""
    if table not in TREE_BLOCK_SIZES:
        raise SpecRagError(f"no tree block sizes for {table!r}; known: {', '.join(TREE_BLOCK_SIZES)}")
    sizes = {**TREE_BLOCK_SIZES[table], **(overrides or {})}
    small = max(16, _pow2_at_least(num_tokens))
    q, chunk = min(sizes["q"], small), min(sizes["chunk"], small)
    pages = max(1, sizes["kv"] // page_size)
    if min(q, chunk, pages) < 1:
        raise SpecRagError(f"block sizes must be positive, got {sizes}")
    return TreeBlocks(q=q, chunk=chunk, pages_per_block=pages, page_size=page_size)
