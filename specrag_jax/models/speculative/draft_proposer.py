"""Draft lookup: propose what follows the context's end in text another model wrote (the RAG drafts).

``drafts`` are continuations written by a drafter, already re-tokenised with the verifier's tokenizer (this
module knows token ids only). ``context`` is the whole sequence so far, ending with the last accepted token
(the tree's root); proposals are continuations after it. The generated text drifts from a draft's start
(other wording, other order), so each draft is aligned afresh at every step:

- **Alignment rule.** The match of a draft is the longest suffix of the context, at most ``max_match``
  tokens, that occurs anywhere in the draft; among occurrences of that length the earliest one in the draft
  wins. A longest match shorter than ``min_match`` means no match.
- **Proposal.** The (up to) ``length`` draft tokens after the match; none if it ends at the draft's end
  (that draft has nothing more to say, even if a shorter suffix occurs earlier).
- One proposal per draft at most, in draft order; a proposal identical to an earlier one is dropped; at most
  ``max_proposals``.

Cost per call: the drafts are concatenated once (construction); a call compares the flat array with the
last context token, then extends the surviving matches one token to the left per step (numpy, at most
``max_match`` steps for all drafts together), so it is O(total draft tokens + matches).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specrag_jax.errors import SpecRagError


@dataclasses.dataclass(frozen=True)
class DraftMatch:
    """Where the context's end aligns in one draft."""

    draft: int  # index into ``DraftProposer.drafts``
    length: int  # context suffix tokens matched (min_match .. max_match)
    end: int  # draft index just after the match: the proposal starts here (== len(draft): nothing to propose)


@dataclasses.dataclass(frozen=True)
class DraftProposer:
    """Draft-lookup proposer: ``proposer(context) -> [continuation, ...]`` (lists of token ids)."""

    drafts: Sequence[Sequence[int]] = ()  # stored as a tuple of tuples of ints
    max_match: int = 16  # longest context suffix tried
    min_match: int = 1  # shorter longest matches propose nothing
    length: int = 8  # tokens proposed per draft
    max_proposals: int = 8  # branches per step
    _flat: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    _owner: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)  # draft per flat token
    _offsets: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)  # [m + 1] flat starts

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise SpecRagError(
                f"draft match sizes need 1 <= min_match <= max_match "
                f"(got min_match={self.min_match}, max_match={self.max_match})"
            )
        if self.length < 1:
            raise SpecRagError(f"draft proposal length must be >= 1 (got {self.length})")
        if self.max_proposals < 1:
            raise SpecRagError(f"draft max_proposals must be >= 1 (got {self.max_proposals})")
        try:
            drafts = None if isinstance(self.drafts, (str, bytes)) else list(self.drafts)
        except TypeError:
            drafts = None
        if drafts is None:
            raise SpecRagError(f"drafts must be a sequence of token-id sequences (got {type(self.drafts).__name__})")
        arrays = [_check_draft(d, i) for i, d in enumerate(drafts)]
        sizes = np.array([len(a) for a in arrays], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        object.__setattr__(self, "drafts", tuple(tuple(a.tolist()) for a in arrays))
        object.__setattr__(self, "_flat", flat)
        object.__setattr__(self, "_owner", np.repeat(np.arange(len(arrays), dtype=np.int64), sizes))
        object.__setattr__(self, "_offsets", offsets)

    def align(self, context: Sequence[int]) -> list[DraftMatch | None]:
        """Per draft (in order), its match with the context's end (alignment rule above) or None."""
        seq = np.asarray(context, dtype=np.int64).reshape(-1)
        m, total = len(self.drafts), len(seq)
        best_len = np.zeros(m, dtype=np.int64)
        best_end = np.zeros(m, dtype=np.int64)  # flat index just after the match
        longest = min(self.max_match, total)
        ends = np.flatnonzero(self._flat == seq[-1]) + 1 if longest else np.zeros(0, np.int64)
        k = 1  # ends: flat ends (exclusive) of the occurrences of the k-token suffix, ascending
        while ends.size:
            owner = self._owner[ends - 1]
            first = np.flatnonzero(np.concatenate([[True], owner[1:] != owner[:-1]]))  # earliest per draft
            best_len[owner[first]] = k
            best_end[owner[first]] = ends[first]
            if k == longest:
                break
            left = ends - k - 1  # the draft token before the match must equal the context token before it
            keep = left >= self._offsets[owner]
            ends, left = ends[keep], left[keep]
            ends = ends[self._flat[left] == seq[total - k - 1]]
            k += 1
        return [
            DraftMatch(d, int(best_len[d]), int(best_end[d] - self._offsets[d]))
            if best_len[d] >= self.min_match
            else None
            for d in range(m)
        ]

    def __call__(self, context: Sequence[int]) -> list[list[int]]:
        proposals: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for match in self.align(context):
            if match is None:
                continue
            prop = self.drafts[match.draft][match.end : match.end + self.length]
            if not prop or prop in seen:
                continue
            seen.add(prop)
            proposals.append(list(prop))
            if len(proposals) == self.max_proposals:
                break
        return proposals


def _check_draft(draft: object, index: int) -> np.ndarray:
    """One draft as a 1-D int64 array of token ids >= 0, or a one-line SpecRagError."""
    if isinstance(draft, (str, bytes)):
        raise SpecRagError(f"draft {index} must be token ids, not text (re-tokenise it with the verifier's tokenizer)")
    try:
        arr = np.asarray(draft)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise SpecRagError(f"draft {index} must be a flat sequence of integer token ids (got {draft!r:.60})")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise SpecRagError(f"draft {index} has a negative token id ({int(arr.min())})")
    return arr
