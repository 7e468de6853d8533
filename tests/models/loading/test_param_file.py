"""The converted-weights file: safetensors layout, memory-mapped read, exact shape/dtype checks."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.param_file import load_tree, save_tree


def tree():
    rng = np.random.default_rng(0)
    return {
        "embed": {"embedding": rng.normal(size=(7, 3)).astype(np.float32)},
        "layers": {
            "q": {"kernel": jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.bfloat16), "bias": np.zeros((2, 5), np.float32)}
        },
        "final_norm": {"scale": np.ones((3,), np.float16)},
    }


def test_round_trip_and_standard_format(tmp_path):
    path = tmp_path / "m.safetensors"
    save_tree(path, tree())
    back = load_tree(path)
    for name, want in [
        ("embed/embedding", tree()["embed"]["embedding"]),
        ("layers/q/kernel", np.asarray(tree()["layers"]["q"]["kernel"])),
    ]:
        a, b = name.split("/", 1)
        got = back[a][b.split("/")[0]][b.split("/")[1]] if "/" in b else back[a][b]
        assert got.dtype == want.dtype and np.array_equal(np.asarray(got), want)
    with safe_open(str(path), framework="numpy") as fh:  # the reference reader agrees (float32 leaves)
        assert np.array_equal(fh.get_tensor("embed/embedding"), tree()["embed"]["embedding"])
        assert set(fh.keys()) == {"embed/embedding", "layers/q/kernel", "layers/q/bias", "final_norm/scale"}
    assert back["layers"]["q"]["kernel"].dtype == ml_dtypes.bfloat16


def test_expected_shapes_and_truncation(tmp_path):
    path = tmp_path / "m.safetensors"
    save_tree(path, tree())
    ok = {
        "embed": {"embedding": ((7, 3), np.float32)},
        "layers": {"q": {"kernel": ((2, 3, 5), ml_dtypes.bfloat16), "bias": ((2, 5), np.float32)}},
        "final_norm": {"scale": ((3,), np.float16)},
    }
    load_tree(path, ok)
    with pytest.raises(SpecRagError, match="tensor embed/embedding is"):
        load_tree(path, {**ok, "embed": {"embedding": ((7, 4), np.float32)}})
    with pytest.raises(SpecRagError, match="tensors differ from the model"):
        load_tree(path, {k: v for k, v in ok.items() if k != "final_norm"})
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SpecRagError, match="truncated"):
        load_tree(path)
