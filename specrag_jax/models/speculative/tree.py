"""Proposals -> token trie for one speculative verification step (lossless mode, DESIGN.md §5.1).

Candidate continuations (lists of verifier token ids, for one sequence) merge into a trie whose siblings
carry distinct tokens, capped by a budget from ``TREE_BUDGETS``. The result is laid out as the verifier's
input chunk, fixed shape ``[budget]``:

- chunk index 0 is the **root**: the last accepted token, sampled but not yet fed (its K/V is not cached);
  its logits row gives the distribution of the first speculated position;
- chunk indices 1.. are trie nodes in priority order (a parent always before its children), valid nodes
  first, then padding.

Priority (which nodes survive the budget, and their chunk order): more proposals passing through the node
first, then shallower, then the node met first when reading the proposals in order. A node's support never
exceeds its parent's, so this order is topological and any prefix of it is a tree.

``parents`` follows the attention contract (``kernels/metadata.py``): chunk-local parent, -1 = attaches to
the cached prefix (the root; padding too). A node at ``depth`` d has RoPE position ``kv_len + d``, so the
accepted path lands on contiguous positions. ``first_child``/``next_sibling`` link each node's children
in chunk order (-1 = none); the acceptance walks them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from specrag_jax.errors import SpecRagError

TREE_BUDGETS = (8, 16, 32, 64)  # chunk tokens: the root plus up to budget - 1 proposed nodes
# the default largest tree per platform: on CPU a tree step's extra tokens are paid in matmul time (a 16-token step
# of Qwen2.5-1.5B costs ~1.35x an 8-token one on 2 cores), so 8 decoded the train split's RAG answers in 0.82x the
# time of 16 (README, lossless mode: "Tree budget"); GPUs and TPUs read the weights once for far more than 16 tokens
DEFAULT_TREE_BUDGETS = {"cpu": 8}
ACCELERATOR_TREE_BUDGET = 16


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenTree:
    """One verification chunk ``[budget]`` (or a stack ``[S, budget]`` from ``stack_trees``), int32/bool."""

    tokens: np.ndarray  # token id per chunk index; tokens[0] = root token; 0 at padding
    parents: np.ndarray  # chunk-local parent, -1 for the root and padding (attention contract)
    depth: np.ndarray  # 0 for the root, d for a node d tokens after it; 0 at padding
    valid: np.ndarray  # True for the root and the kept nodes (a prefix of the chunk)
    first_child: np.ndarray  # chunk index of the first child, -1 = leaf / padding
    next_sibling: np.ndarray  # chunk index of the next child of the same parent, -1 = last

    @property
    def budget(self) -> int:
        return int(self.tokens.shape[-1])

    @property
    def num_tokens(self) -> int:
        """Valid chunk tokens (root + nodes) of a single tree."""
        return int(np.asarray(self.valid).sum())

    def positions(self, kv_len: int) -> np.ndarray:
        """RoPE positions of the chunk tokens after ``kv_len`` cached tokens."""
        return (kv_len + np.asarray(self.depth)).astype(np.int32)


def check_budget(budget: int) -> int:
    if budget not in TREE_BUDGETS:
        raise SpecRagError(f"tree budget must be one of {', '.join(map(str, TREE_BUDGETS))} (got {budget!r})")
    return int(budget)


def default_tree_budget(platform: str | None = None) -> int:
    """The default largest token tree per step on ``platform`` (default: JAX's default backend): 8 on CPU, 16
    on a GPU or TPU."""
    return DEFAULT_TREE_BUDGETS.get(platform or jax.default_backend(), ACCELERATOR_TREE_BUDGET)


def fit_budget(num_nodes: int, max_budget: int = TREE_BUDGETS[-1]) -> int:
    """Smallest budget holding the root and ``num_nodes`` nodes, at most ``max_budget``."""
    check_budget(max_budget)
    return next((b for b in TREE_BUDGETS if b >= num_nodes + 1 and b <= max_budget), max_budget)


def largest_fitting_budget(kv_end: int, slots: int, max_budget: int) -> int | None:
    """The largest budget within ``max_budget`` whose tree, written from K/V slot ``kv_end``, ends within
    ``slots`` (the context or the pages held); None when none fits. The Generator and the engine both use it."""
    fits = [b for b in TREE_BUDGETS if b <= max_budget and kv_end + b <= slots]
    return fits[-1] if fits else None


def count_trie_nodes(proposals: Sequence[Sequence[int]]) -> int:
    """Distinct non-empty prefixes among the proposals (the trie's node count, uncapped)."""
    return len({tuple(int(t) for t in p[: i + 1]) for p in proposals for i in range(len(p))})


def build_tree(
    proposals: Sequence[Sequence[int]], root_token: int, budget: int, *, vocab_size: int | None = None
) -> TokenTree:
    """Merge ``proposals`` (continuations after ``root_token``) into a ``TokenTree`` of ``budget`` tokens."""
    check_budget(budget)
    _check_token(root_token, vocab_size, "root token")
    # Full trie; node 0 = root. Per node: token, parent, depth, support, creation order (= list index).
    tok, par, dep, sup = [int(root_token)], [-1], [0], [0]
    kids: list[dict[int, int]] = [{}]
    for prop in proposals:
        node = 0
        for t in prop:
            t = _check_token(t, vocab_size, "proposed token")
            child = kids[node].get(t)
            if child is None:
                child = len(tok)
                kids[node][t] = child
                tok.append(t)
                par.append(node)
                dep.append(dep[node] + 1)
                sup.append(0)
                kids.append({})
            sup[child] += 1
            node = child
    order = sorted(range(1, len(tok)), key=lambda i: (-sup[i], dep[i], i))[: budget - 1]
    index = {0: 0, **{old: new for new, old in enumerate(order, start=1)}}

    tree = _empty(budget)
    tree.tokens[0] = tok[0]
    tree.valid[0] = True
    last_child = np.full(budget, -1, np.int32)
    for old in order:
        i, p = index[old], index[par[old]]
        tree.tokens[i], tree.parents[i], tree.depth[i], tree.valid[i] = tok[old], p, dep[old], True
        if last_child[p] < 0:
            tree.first_child[p] = i
        else:
            tree.next_sibling[last_child[p]] = i
        last_child[p] = i
    return tree


def stack_trees(trees: Sequence[TokenTree]) -> TokenTree:
    """Stack same-budget trees into one ``[S, budget]`` TokenTree (a batch for the acceptance)."""
    if not trees:
        raise SpecRagError("stack_trees needs at least one tree")
    if len({t.budget for t in trees}) != 1:
        raise SpecRagError(f"trees of one batch need one budget (got {sorted({t.budget for t in trees})})")
    return TokenTree(**{f.name: np.stack([getattr(t, f.name) for t in trees]) for f in dataclasses.fields(TokenTree)})


# The value of every TokenTree field at a padding chunk index (and in an empty padded sequence).
PADDING = {"tokens": 0, "parents": -1, "depth": 0, "valid": False, "first_child": -1, "next_sibling": -1}


def pad_tree(tree: TokenTree, budget: int) -> TokenTree:
    """A tree (or stack) of fewer chunk tokens padded to ``budget`` along its chunk axis."""
    extra = budget - tree.budget
    if extra <= 0:
        return tree

    def grow(name: str) -> np.ndarray:
        a = np.asarray(getattr(tree, name))
        return np.concatenate([a, np.full(a.shape[:-1] + (extra,), PADDING[name], a.dtype)], axis=-1)

    return TokenTree(**{f.name: grow(f.name) for f in dataclasses.fields(TokenTree)})


def _empty(budget: int) -> TokenTree:
    neg = lambda: np.full(budget, -1, np.int32)  # noqa: E731
    return TokenTree(
        tokens=np.zeros(budget, np.int32),
        parents=neg(),
        depth=np.zeros(budget, np.int32),
        valid=np.zeros(budget, bool),
        first_child=neg(),
        next_sibling=neg(),
    )


def _check_token(t: object, vocab_size: int | None, what: str) -> int:
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
        raise SpecRagError(f"{what} must be an integer token id (got {t!r})")
    if t < 0 or (vocab_size is not None and t >= vocab_size):
        allowed = ">= 0" if vocab_size is None else f"in [0, {vocab_size})"
        raise SpecRagError(f"{what} must be {allowed} (got {t})")
    return int(t)
