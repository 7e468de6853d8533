"""The parameter tree by leaf path, and the helpers every loader shares.

``flatten_tree`` / ``unflatten``: nested parameter dicts <-> flat ``{"layers/attn/q/kernel": leaf}`` maps (the
names loaders and files use). ``flatten_shapes`` flattens ``param_shapes(cfg)``; ``check_shape`` is the one-line
error for a source tensor of the wrong shape; ``assemble_params`` builds the stacked tree from named source
tensors (the GGUF and Hugging Face host loaders).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig, kernel_in_out, param_shapes


def flatten_tree(
    tree: Mapping[str, Any], prefix: str = "", is_leaf: Callable[[Any], bool] = lambda x: not isinstance(x, Mapping)
) -> dict[str, Any]:
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


def flatten_shapes(tree: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Flatten ``param_shapes(cfg)`` into ``{"layers/attn/q/kernel": shape}``."""
    return {path: tuple(shape) for path, shape in flatten_tree(tree, is_leaf=lambda x: isinstance(x, tuple)).items()}


def check_shape(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    """A one-line error unless a source (``[in, out]`` for matrices) has the shape its slot needs."""
    if tuple(got) != tuple(want):
        raise SpecRagError(f"tensor {name!r} has shape {tuple(got)} ([in, out] for matrices), expected {tuple(want)}")


LeafFn = Callable[[np.ndarray], Any]


def assemble_params(
    cfg: ModelConfig,
    names: Mapping[str, str],
    fetch: Callable[[str, str], np.ndarray],
    leaf_fn: LeafFn | None = None,
) -> dict[str, Any]:
    """Build the stacked tree; ``fetch(source_name, leaf)`` returns an ``[out, in]`` (experts: ``[E, out, in]``)
    float32 array; a name with ``{j}`` is fetched once per expert and stacked.

    Kernels stay ``[out, in]`` except the MoE block's (``kernel_in_out``), transposed to ``[in, out]``; per-layer
    tensors are written into one stacked array.
    Each finished float32 leaf goes through ``leaf_fn`` (e.g. a cast to a jax array) before the next
    is built, so peak memory is the converted tree plus about one leaf.
    """
    finish = leaf_fn or (lambda x: x)
    flat: dict[str, Any] = {}
    for leaf, shape in flatten_shapes(param_shapes(cfg)).items():
        template = names[leaf]
        kernel = kernel_in_out(leaf, cfg)
        if not leaf.startswith("layers/"):
            w = fetch(template, leaf)
            w = np.ascontiguousarray(w.T if kernel else w, dtype=np.float32)
            check_shape(template, w.shape, shape)
            flat[leaf] = finish(w)
            del w
            continue
        stacked = np.empty(shape, dtype=np.float32)
        for i in range(cfg.num_layers):
            name = template.replace("{j}", "*").format(i=i)
            if "{j}" in template:  # one tensor per expert: stacked on a leading expert axis
                w = np.stack(
                    [_fetch_checked(fetch, template.format(i=i, j=j), leaf, shape[2:]) for j in range(cfg.num_experts)]
                )
            else:
                w = fetch(name, leaf)
            w = np.swapaxes(w, -1, -2) if kernel else w  # MoE: [E,] out, in -> [E,] in, out
            check_shape(name, w.shape, shape[1:])
            stacked[i] = w
        flat[leaf] = finish(stacked)
        del stacked
    return unflatten(flat)


def _fetch_checked(fetch: Callable[[str, str], np.ndarray], name: str, leaf: str, want: tuple[int, ...]) -> np.ndarray:
    """One expert's ``[out, in]`` tensor, its shape checked (as ``[in, out]``) before stacking."""
    w = fetch(name, leaf)
    check_shape(name, w.shape[::-1], want)
    return w
