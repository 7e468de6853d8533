"""Length buckets + sequence packing: every batch is ``[rows, L]`` with ``L`` from a short bucket list.

An example goes to the smallest bucket that holds it; inside a bucket, examples are packed first-fit into
rows (at most ``max_segments`` per row). Packed examples never see each other: each is its own attention
sequence (``segments``) with positions restarting at 0. A run therefore compiles one train program per
bucket length in use (a handful), whatever the spread of example lengths.

An epoch's batch order is a pure function of ``(seed, epoch)``, so a data position ``(epoch, index)`` is
enough to resume exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.training.data import Example

DEFAULT_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096)


@dataclasses.dataclass(frozen=True)
class Batch:
    """Host arrays of one step, all ``[rows, L]``.

    ``labels[r, i]`` is the token after ``tokens[r, i]`` in the same example; ``mask`` is 1.0 where that label
    is a target token (the loss), else 0.0. ``segments`` numbers the packed examples of a row (-1 = padding).
    """

    tokens: np.ndarray
    labels: np.ndarray
    mask: np.ndarray
    segments: np.ndarray
    positions: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)  # type: ignore[return-value]

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int((self.segments >= 0).sum())

    @property
    def num_targets(self) -> int:
        return int(self.mask.sum())


def bucket_lengths(max_len: int, buckets: Sequence[int] | None = None) -> tuple[int, ...]:
    """Sorted bucket lengths up to ``max_len`` (``max_len`` itself always included)."""
    if max_len < 2:
        raise SpecRagError(f"max_len must be >= 2 (got {max_len})")
    chosen = sorted({b for b in (buckets or DEFAULT_BUCKETS) if 2 <= b < max_len} | {max_len})
    return tuple(chosen)


def bucket_of(length: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if length <= b:
            return b
    raise SpecRagError(f"an example of {length} tokens is longer than the largest bucket ({buckets[-1]})")


def pack_rows(examples: Sequence[Example], length: int, max_segments: int) -> list[list[Example]]:
    """First-fit packing of examples (in the given order) into rows of ``length`` tokens."""
    rows: list[list[Example]] = []
    room: list[int] = []
    for ex in examples:
        for r, free in enumerate(room):
            if ex.length <= free and len(rows[r]) < max_segments:
                rows[r].append(ex)
                room[r] -= ex.length
                break
        else:
            rows.append([ex])
            room.append(length - ex.length)
    return rows


def make_batch(rows: Sequence[Sequence[Example]], num_rows: int, length: int) -> Batch:
    """Fill ``[num_rows, length]`` arrays from packed rows (missing rows are all padding)."""
    if len(rows) > num_rows:
        raise SpecRagError(f"{len(rows)} packed rows do not fit a batch of {num_rows}")
    shape = (num_rows, length)
    tokens, labels = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    mask, positions = np.zeros(shape, np.float32), np.zeros(shape, np.int32)
    segments = np.full(shape, -1, np.int32)
    for r, row in enumerate(rows):
        start = 0
        for s, ex in enumerate(row):
            ids = np.concatenate([ex.prompt_ids, ex.target_ids])
            n, end = len(ids), start + len(ids)
            tokens[r, start:end] = ids
            labels[r, start : end - 1] = ids[1:]
            # label i is token i+1: a target token when i+1 >= len(prompt)
            mask[r, start + len(ex.prompt_ids) - 1 : end - 1] = 1.0
            segments[r, start:end] = s
            positions[r, start:end] = np.arange(n)
            start = end
    return Batch(tokens, labels, mask, segments, positions)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How examples become batches: rows per batch, bucket lengths, examples per row."""

    rows: int
    buckets: tuple[int, ...]
    max_segments: int = 8

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise SpecRagError(f"batch size must be >= 1 row (got {self.rows})")
        if self.max_segments < 1:
            raise SpecRagError(f"max_segments must be >= 1 (got {self.max_segments})")

    def batches(self, examples: Sequence[Example], seed: int | None, epoch: int = 0) -> list[Batch]:
        """All batches of one epoch; ``seed=None`` keeps the given order (the held-out split)."""
        order = list(range(len(examples)))
        rng = None if seed is None else np.random.default_rng([seed, epoch])
        if rng is not None:
            order = rng.permutation(len(examples)).tolist()
        by_bucket: dict[int, list[Example]] = {}
        for i in order:
            by_bucket.setdefault(bucket_of(examples[i].length, self.buckets), []).append(examples[i])
        out: list[Batch] = []
        for length in sorted(by_bucket):
            rows = pack_rows(by_bucket[length], length, self.max_segments)
            out += [make_batch(rows[i : i + self.rows], self.rows, length) for i in range(0, len(rows), self.rows)]
        if rng is not None:
            out = [out[i] for i in rng.permutation(len(out))]
        return out


class BatchStream:
    """Endless batches over epochs from a data position ``(epoch, index)``; ``position`` is the next batch."""

    def __init__(self, plan: BatchPlan, examples: Sequence[Example], seed: int, epoch: int = 0, index: int = 0) -> None:
        self.plan, self.examples, self.seed = plan, list(examples), seed
        self.epoch, self.index = epoch, index
        self._batches = plan.batches(self.examples, seed, epoch)
        if not self._batches:
            raise SpecRagError("no training batches: the training split is empty")

    @property
    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def next(self) -> Batch:
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self.plan.batches(self.examples, self.seed, self.epoch)
        batch = self._batches[self.index]
        self.index += 1
        return batch
