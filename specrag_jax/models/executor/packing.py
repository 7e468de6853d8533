"""Packing: the new tokens of several sequences (chunks) into one bucketed step's host arrays.

A *chunk* is the new tokens of one sequence in a step (a prompt piece, one decode token, or a token tree
for verification). Sequence count and page-table width are padded to powers of two (a caller's ``min_seqs``
that covers the chunks is kept as given: ``seq_count_bucket``'s decode widths); the token count follows
``token_count_bucket``'s ladder (powers of two up to 256, then sixteenths of the next power of two), so the number
of compiled programs stays small and fixed while a long step wastes at most 1/9 of its tokens on padding.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import NULL_PAGE, AttentionMetadata


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(n, minimum, 1)
    return 1 << (n - 1).bit_length()


FINE_BUCKETS_FROM = 256  # above this many tokens the ladder steps by 1/16 of the next power of two


def token_count_bucket(n: int, minimum: int = 1) -> int:
    """Padded token count of a step: ``bucket`` up to 256 tokens, above it the next multiple of 1/16 of the
    enclosing power of two (257..512 -> 288, 320, .., 512; 1317 -> 1408), so padding is under 1/9 of a step
    (a power-of-two bucket wastes up to half: a 1,317-token tree paid for 2,048 tokens)."""
    n = max(n, minimum, 1)
    p = bucket(n)
    if p <= FINE_BUCKETS_FROM:
        return p
    step = p // 16
    return -(-n // step) * step


EXACT_SEQ_COUNTS = 8  # decode batches up to this many sequences run unpadded


def seq_count_bucket(n: int) -> int:
    """Rows of a decode batch of ``n`` sequences: ``n`` itself up to 8, then powers of two and the 1.5x between
    them (12, 16, 24, 32, ..), so padding wastes under a third. Every padded row costs a decode step its share
    of attention (measured: five drafts on eight rows paid for eight)."""
    n = max(n, 1)
    if n <= EXACT_SEQ_COUNTS:
        return n
    p = bucket(n)
    return p * 3 // 4 if n <= p * 3 // 4 else p


def seq_count_buckets(hi: int) -> list[int]:
    """Every ``seq_count_bucket`` value up to ``hi``'s (warm-up enumerations)."""
    out = [1]
    while out[-1] < seq_count_bucket(hi):
        out.append(seq_count_bucket(out[-1] + 1))
    return out


def _padded(n: int, minimum: int) -> int:
    """``minimum`` when it covers ``n`` (the caller's own bucket), else the next power of two."""
    return minimum if n <= minimum else bucket(n)


def token_count_buckets(lo: int, hi: int) -> list[int]:
    """Every ``token_count_bucket`` value from ``lo``'s bucket up to ``hi``'s (warm-up enumerations)."""
    out, n = [], token_count_bucket(lo)
    last = token_count_bucket(hi)
    while n <= last:
        out.append(n)
        n = token_count_bucket(n + 1)
    return out


@dataclasses.dataclass
class Chunk:
    """New tokens of one sequence in one step.

    pages: the sequence's pages (enough for kv_len + len(tokens) when ``write``).
    parents: chunk-local parent of each token (-1 = attaches to the cached prefix); default a causal chain.
    positions: RoPE positions; default ``kv_len + arange``.
    write: store this chunk's K/V in the pool at logical slots kv_len.. (False for throw-away trees).
    rows: chunk-local token indices whose next-token distribution is wanted (sampling or scoring).
    """

    pages: Sequence[int]
    kv_len: int
    tokens: Sequence[int]
    parents: Sequence[int] | None = None
    positions: Sequence[int] | None = None
    write: bool = True
    rows: Sequence[int] = ()


@dataclasses.dataclass
class PackedStep:
    tokens: np.ndarray
    meta: AttentionMetadata
    rows: np.ndarray  # packed indices of the wanted rows, padded
    num_rows: int
    tree: bool  # some chunk is a token tree (not a causal chain)
    decode: bool  # every chunk is a single token continuing its sequence


def pack_chunks(
    chunks: Sequence[Chunk],
    *,
    page_size: int,
    num_slots: int,
    min_token_bucket: int = 16,
    min_page_bucket: int = 16,
    max_page_bucket: int = 1 << 30,
    token_bucket: int | None = None,
    min_seqs: int = 1,
) -> PackedStep:
    """Pad and pack chunks into one step's arrays (numpy); ``num_slots`` = pool pages x page size.

    ``min_seqs`` pads the sequence and row counts to exactly that many when they fit (keeps a shrinking decode
    batch on one compiled shape), else to the next power of two.
    """

    if not chunks:
        raise SpecRagError("a step needs at least one chunk")
    total = sum(len(c.tokens) for c in chunks)
    t_pad = token_bucket or token_count_bucket(total, min_token_bucket)
    s_pad = _padded(len(chunks), min_seqs)
    widest = max(max(len(c.pages), 1) for c in chunks)
    p_pad = min(bucket(widest, min_page_bucket), max_page_bucket)
    drop = num_slots  # any slot >= this is not written
    tokens = np.zeros(t_pad, np.int32)
    token_seq = np.zeros(t_pad, np.int32)
    positions = np.zeros(t_pad, np.int32)
    parents = np.full(t_pad, -1, np.int32)
    valid = np.zeros(t_pad, bool)
    write_slots = np.full(t_pad, drop, np.int32)
    page_table = np.full((s_pad, p_pad), NULL_PAGE, np.int32)
    kv_lens = np.zeros(s_pad, np.int32)
    rows: list[int] = []
    tree = False
    start = 0
    for s, c in enumerate(chunks):
        n = len(c.tokens)
        end = start + n
        page_table[s, : len(c.pages)] = c.pages
        kv_lens[s] = c.kv_len
        tokens[start:end] = c.tokens
        token_seq[start:end] = s
        valid[start:end] = True
        positions[start:end] = c.positions if c.positions is not None else c.kv_len + np.arange(n)
        local = np.arange(n) - 1 if c.parents is None else np.asarray(c.parents, np.int64)
        if c.parents is not None and np.any(local != np.arange(n) - 1):
            tree = True
            if np.any(local >= np.arange(n)):  # attention relies on it (kernels/blocked.py)
                raise SpecRagError(f"chunk {s}: a token's parent must be packed before it")
        parents[start:end] = np.where(local < 0, -1, local + start)
        if c.write:
            logical = c.kv_len + np.arange(n)
            page_ids = np.asarray(c.pages, np.int64)[logical // page_size]
            write_slots[start:end] = page_ids * page_size + logical % page_size
        rows.extend(start + int(r) for r in c.rows)
        start = end
    r_pad = _padded(len(rows), min_seqs)
    row_arr = np.zeros(r_pad, np.int32)
    row_arr[: len(rows)] = rows
    meta = AttentionMetadata(
        token_seq=token_seq,
        positions=positions,
        parents=parents,
        token_valid=valid,
        write_slots=write_slots,
        page_table=page_table,
        kv_lens=kv_lens,
    )
    decode = all(len(c.tokens) == 1 and c.parents is None for c in chunks)
    return PackedStep(tokens, meta, row_arr, len(rows), tree, decode)
