"""Proposers for lossless speculative decoding: the protocol, their combination, and selection by name.

A proposer maps the sequence so far (ending with the tree's root, the last accepted token) to candidate
continuations after it; ``tree.build_tree`` merges them into the verification trie.

- ``"ngram"``: prompt lookup in the context (``NgramProposer``);
- ``"drafts"``: lookup in the drafter's re-tokenised drafts (``DraftProposer``);
- ``"both"``: the drafts' proposals first, then the n-gram ones (``CombinedProposer``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from specrag_jax.errors import SpecRagError
from specrag_jax.models.speculative.draft_proposer import DraftProposer
from specrag_jax.models.speculative.ngram_proposer import NgramProposer

PROPOSERS = ("ngram", "drafts", "both")


class Proposer(Protocol):
    """``proposer(context) -> [continuation, ...]``: token-id lists to follow ``context[-1]``."""

    def __call__(self, context: Sequence[int]) -> list[list[int]]: ...


@dataclasses.dataclass(frozen=True)
class CombinedProposer:
    """The proposals of several proposers, in their order; a proposal identical to an earlier one is dropped."""

    proposers: Sequence[Proposer]  # stored as a tuple

    def __post_init__(self) -> None:
        proposers = tuple(self.proposers)
        if not proposers:
            raise SpecRagError("CombinedProposer needs at least one proposer")
        bad = [i for i, p in enumerate(proposers) if not callable(p)]
        if bad:
            raise SpecRagError(f"proposer {bad[0]} is not callable (got {type(proposers[bad[0]]).__name__})")
        object.__setattr__(self, "proposers", proposers)

    def __call__(self, context: Sequence[int]) -> list[list[int]]:
        proposals: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for proposer in self.proposers:
            for prop in proposer(context):
                key = tuple(int(t) for t in prop)
                if key and key not in seen:
                    seen.add(key)
                    proposals.append(list(key))
        return proposals


def make_proposer(
    name: str,
    drafts: Sequence[Sequence[int]] = (),
    *,
    draft_options: Mapping[str, Any] | None = None,
    **ngram_kwargs: Any,
) -> Proposer:
    """The proposer called ``name`` (one of ``PROPOSERS``).

    ``drafts`` (verifier token ids; may be empty: that part then proposes nothing) and ``draft_options``
    (``DraftProposer`` settings) serve "drafts"/"both"; ``ngram_kwargs`` (``NgramProposer`` settings) serve
    "ngram"/"both". Options of a part the name does not use are ignored, so callers may pass them uniformly.
    """
    if name not in PROPOSERS:
        raise SpecRagError(f"unknown proposer {name!r} (choose one of {', '.join(PROPOSERS)})")
    parts: list[Proposer] = []
    if name in ("drafts", "both"):
        parts.append(DraftProposer(drafts, **_options(DraftProposer, dict(draft_options or {}), "draft")))
    if name in ("ngram", "both"):
        parts.append(NgramProposer(**_options(NgramProposer, ngram_kwargs, "n-gram")))
    return parts[0] if len(parts) == 1 else CombinedProposer(parts)


def _options(cls: type, options: dict[str, Any], what: str) -> dict[str, Any]:
    allowed = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "drafts"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise SpecRagError(f"unknown {what} proposer option(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")
    return options
