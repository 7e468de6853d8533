"""Lossless token-tree speculation: proposals -> trie -> one verifier pass -> accepted tokens.

``tree`` (proposals merged into a token trie under a bucketed budget), ``accept`` (greedy-exact and
sampling-lossless acceptance, jitted; ``accept_ref`` is its plain reference), ``verify_step`` (the fused device
step: tree pass, acceptance, K/V compaction), ``decode`` (``Speculation``: how a request speculates, its
counts; the engine's speculation steps run it), ``proposers`` (the protocol and selection by name) with
``ngram_proposer`` (prompt lookup) and ``draft_proposer`` (lookup in the RAG drafts).
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "tree": ("TREE_BUDGETS", "TokenTree", "build_tree", "stack_trees"),
    "accept": ("AcceptResult", "accept_tree", "accept_trees"),
    "decode": ("Speculation", "SpeculationStats", "combine_stats"),
    "proposers": ("PROPOSERS", "CombinedProposer", "Proposer", "make_proposer"),
    "ngram_proposer": ("NgramProposer",),
    "draft_proposer": ("DraftProposer",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
