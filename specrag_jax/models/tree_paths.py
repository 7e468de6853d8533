"""Nested parameter dicts <-> flat ``{"layers/attn/q/kernel": leaf}`` maps (the names loaders and files use)."""

from __future__ import annotations

from typing import Any, Callable, Mapping


def flatten_tree(tree: Mapping[str, Any], prefix: str = "",
                 is_leaf: Callable[[Any], bool] = lambda x: not isinstance(x, Mapping)) -> dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if is_leaf(value):
            out[path] = value
        else:
            out.update(flatten_tree(value, path + "/", is_leaf))
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of ``flatten_tree``."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree
