"""Block sizes of the Pallas paged decode kernel, per backend (a small table, not an autotuner).

``kv_tokens_per_block``: keys loaded and scored per inner step (rounded to whole pages; the TPU value keeps
2 buffers x K and V x block well inside VMEM for Gemma 3's 1 x 256 head layout in float32, the GPU value
keeps a block in registers/shared memory of one program). ``max_splits``: grid cells per token across the
pages (flash-decoding); a GPU needs many cells to fill its SMs at small batch, a TPU core runs the grid
sequentially (megacore splits it over 2 cores), so fewer, larger splits are better there.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DecodeBlockSizes:
    kv_tokens_per_block: int
    max_splits: int
    min_pages_per_split: int = 1

    def pages_per_block(self, page_size: int, pages_per_seq: int) -> int:
        return max(1, min(self.kv_tokens_per_block // page_size, pages_per_seq))

    def num_splits(self, page_size: int, pages_per_seq: int) -> int:
        ppb = self.pages_per_block(page_size, pages_per_seq)
        blocks = -(-pages_per_seq // max(ppb, self.min_pages_per_split))
        return max(1, min(self.max_splits, blocks))


BLOCK_SIZES: dict[str, DecodeBlockSizes] = {
    "tpu": DecodeBlockSizes(kv_tokens_per_block=512, max_splits=2, min_pages_per_split=8),
    "gpu": DecodeBlockSizes(kv_tokens_per_block=64, max_splits=16, min_pages_per_split=4),
}


def block_sizes_for(backend: str) -> DecodeBlockSizes:
    return BLOCK_SIZES[backend]
