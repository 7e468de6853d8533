"""Prompt lookup: propose what followed earlier occurrences of the context's last n tokens.

``context`` is the whole token sequence so far (prompt, evidence, output, ending with the last accepted
token, the tree's root). For n = ``max_ngram`` down to ``min_ngram``, every earlier position where the last
n tokens occur proposes the (up to) ``length`` tokens that followed it. Order: longer matches first, then
the most recent; a continuation already proposed by a longer match (same start) is not repeated. Several
matches become several branches of the token trie (``tree.build_tree``), where agreeing matches add
support. Host-side numpy; one vectorised scan of the context per n.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError


@dataclasses.dataclass(frozen=True)
class NgramProposer:
    """Prompt-lookup proposer: ``proposer(context) -> [continuation, ...]`` (lists of token ids)."""

    max_ngram: int = 3
    min_ngram: int = 1
    length: int = 8  # tokens proposed per match
    max_proposals: int = 4  # branches per step

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise SpecRagError(
                f"n-gram sizes need 1 <= min_ngram <= max_ngram "
                f"(got min_ngram={self.min_ngram}, max_ngram={self.max_ngram})"
            )
        if self.length < 1:
            raise SpecRagError(f"n-gram proposal length must be >= 1 (got {self.length})")
        if self.max_proposals < 1:
            raise SpecRagError(f"n-gram max_proposals must be >= 1 (got {self.max_proposals})")

    def __call__(self, context: Sequence[int]) -> list[list[int]]:
        seq = np.asarray(context, dtype=np.int64).reshape(-1)
        total = len(seq)
        proposals: list[list[int]] = []
        starts: set[int] = set()
        for n in range(min(self.max_ngram, total - 1), self.min_ngram - 1, -1):
            # Candidate match starts i = 0 .. total - n - 1 (the suffix itself, at total - n, excluded).
            hits = np.ones(total - n, dtype=bool)
            for j in range(n):
                hits &= seq[j : total - n + j] == seq[total - n + j]
            for i in np.flatnonzero(hits)[::-1]:  # most recent first
                start = int(i) + n
                if start in starts:
                    continue
                starts.add(start)
                proposals.append(seq[start : start + self.length].tolist())
                if len(proposals) == self.max_proposals:
                    return proposals
        return proposals
