"""Proposals -> token trie: merging, distinct siblings, budget and priority, attention-contract parents."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.kernels.metadata import ancestor_mask
from specrag_jax.models.speculative.tree import (
    TREE_BUDGETS,
    TokenTree,
    build_tree,
    check_budget,
    count_trie_nodes,
    default_tree_budget,
    fit_budget,
    largest_fitting_budget,
    stack_trees,
)


def paths(tree: TokenTree) -> set[tuple[int, ...]]:
    """Token path (after the root) of every valid node."""
    out = set()
    for c in range(1, tree.budget):
        if tree.valid[c]:
            seq, u = [], c
            while u > 0:
                seq.append(int(tree.tokens[u]))
                u = int(tree.parents[u])
            out.add(tuple(reversed(seq)))
    return out


def check_invariants(tree: TokenTree, proposals) -> None:
    b, n = tree.budget, tree.num_tokens
    assert b in TREE_BUDGETS and tree.valid[:n].all() and not tree.valid[n:].any()  # valid = a prefix
    assert tree.parents[0] == -1 and tree.depth[0] == 0
    for c in range(1, n):
        p = tree.parents[c]
        assert 0 <= p < c  # parent before child
        assert tree.depth[c] == tree.depth[p] + 1
    assert (tree.parents[n:] == -1).all() and (tree.first_child[n:] == -1).all()
    # Sibling links list exactly the children of each node, in chunk order; siblings are distinct.
    for u in range(n):
        linked, c = [], tree.first_child[u]
        while c >= 0:
            linked.append(int(c))
            c = tree.next_sibling[c]
        assert linked == [c for c in range(1, n) if tree.parents[c] == u]
        toks = [int(tree.tokens[c]) for c in linked]
        assert len(toks) == len(set(toks))
    # Every kept node is a prefix of some proposal; distinct nodes have distinct paths (merged).
    prefixes = {tuple(p[: i + 1]) for p in proposals for i in range(len(p))}
    kept = paths(tree)
    assert kept <= prefixes and len(kept) == n - 1
    assert n - 1 == min(len(prefixes), b - 1)
    # The attention contract accepts these parents: ancestors = the path to the root.
    mask = np.asarray(ancestor_mask(tree.parents[:n]))
    for c in range(n):
        assert mask[c].sum() == tree.depth[c] + 1 and mask[c, 0]


def test_duplicates_merge_and_priority():
    props = [[5, 6, 7], [5, 6, 9], [5, 6, 7], [3], [8, 1]]
    tree = build_tree(props, root_token=42, budget=8)
    check_invariants(tree, props)
    assert tree.tokens[0] == 42
    # support 3: 5, 6; support 2: 7; support 1 by depth, then first seen: 3, 8 (d1), 1 (d2), 9 (d3)
    assert tree.tokens[1:8].tolist() == [5, 6, 7, 3, 8, 1, 9]
    assert tree.parents[1:8].tolist() == [0, 1, 2, 0, 0, 5, 2]
    assert tree.depth[1:8].tolist() == [1, 2, 3, 1, 1, 2, 3]
    assert tree.first_child[0] == 1 and tree.next_sibling[1] == 4 and tree.next_sibling[4] == 5
    assert tree.next_sibling[5] == -1 and tree.first_child[2] == 3 and tree.next_sibling[3] == 7


def test_budget_caps_by_priority():
    props = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 11], [20]]
    tree = build_tree(props, root_token=0, budget=8)
    check_invariants(tree, props)
    assert tree.tokens[1:].tolist() == [1, 2, 20, 3, 11, 4, 5]  # shared prefix first, then shallow


def test_empty_and_padding():
    tree = build_tree([[], []], root_token=7, budget=16)
    assert tree.num_tokens == 1 and tree.first_child[0] == -1 and tree.tokens[0] == 7
    assert tree.positions(10).tolist()[:1] == [10]


def test_positions_follow_depth():
    tree = build_tree([[4, 5, 6]], root_token=3, budget=8)
    assert tree.positions(100)[:4].tolist() == [100, 101, 102, 103]


@pytest.mark.parametrize("bad", [0, 4, 12, 128, -8, "16", 16.5])
def test_bad_budget_is_one_line_error(bad):
    with pytest.raises(SpecRagError, match=r"tree budget must be one of 8, 16, 32, 64") as err:
        build_tree([[1]], root_token=0, budget=bad)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "props,root,msg",
    [
        ([[1, -2]], 0, r"proposed token must be in \[0, 50\) \(got -2\)"),
        ([[1, 2.0]], 0, "must be an integer"),
        ([[1, 99]], 0, r"proposed token must be in \[0, 50\)"),
        ([[1]], 50, r"root token must be in \[0, 50\)"),
    ],
)
def test_bad_tokens(props, root, msg):
    with pytest.raises(SpecRagError, match=msg):
        build_tree(props, root_token=root, budget=8, vocab_size=50)


def test_default_tree_budget_is_8_on_cpu_16_on_accelerators():
    assert [default_tree_budget(p) for p in ("cpu", "gpu", "tpu")] == [8, 16, 16]
    assert default_tree_budget() == (8 if jax.default_backend() == "cpu" else 16)
    assert all(check_budget(default_tree_budget(p)) for p in ("cpu", "gpu"))


def test_fit_budget_and_stack():
    assert [fit_budget(n) for n in (0, 7, 8, 15, 16, 63, 500)] == [8, 8, 16, 16, 32, 64, 64]
    assert fit_budget(40, max_budget=16) == 16
    assert count_trie_nodes([[1, 2], [1, 3], [1, 2]]) == 3
    trees = [build_tree([[1, 2]], 0, 8), build_tree([[3]], 1, 8)]
    stacked = stack_trees(trees)
    assert stacked.tokens.shape == (2, 8) and stacked.tokens[1, :2].tolist() == [1, 3]
    with pytest.raises(SpecRagError, match="one budget"):
        stack_trees([trees[0], build_tree([[1]], 0, 16)])


proposal_lists = st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=6), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(props=proposal_lists, budget=st.sampled_from(TREE_BUDGETS))
def test_random_tries_keep_invariants(props, budget):
    tree = build_tree(props, root_token=1, budget=budget)
    check_invariants(tree, props)
    assert tree.num_tokens - 1 == min(count_trie_nodes(props), budget - 1)


def test_negative_token_without_vocab():
    with pytest.raises(SpecRagError, match="proposed token must be >= 0"):
        build_tree([[-1]], root_token=0, budget=8)


@given(st.integers(0, 300), st.integers(0, 300), st.sampled_from(TREE_BUDGETS))
@settings(max_examples=200, deadline=None)
def test_largest_fitting_budget_is_the_largest_that_fits(kv_end, slots, max_budget):
    """The budget rule the Generator and the serving engine share: the largest budget under the cap that fits."""
    got = largest_fitting_budget(kv_end, slots, max_budget)
    if got is None:
        assert kv_end + TREE_BUDGETS[0] > slots  # not even the smallest tree fits
    else:
        assert got in TREE_BUDGETS and got <= max_budget and kv_end + got <= slots
        nxt = TREE_BUDGETS.index(got) + 1
        assert nxt == len(TREE_BUDGETS) or TREE_BUDGETS[nxt] > max_budget or kv_end + TREE_BUDGETS[nxt] > slots
