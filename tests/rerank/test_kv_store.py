"""DocKVStore faults: an edited document, another model or dtype, truncated or corrupt files are detected."""

from __future__ import annotations

import json
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.text_model import TextModel
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.reranker import Reranker
from specrag_jax.serving.tiny import CharTokenizer, tiny_text_model

QUESTION = "Who built the bridge?"
DOCS = [
    {"id": str(i), "title": f"Bridge {i}", "text": f"Bridge {i} was built by guild {i}. " * (i + 1)} for i in range(5)
]


@pytest.fixture(scope="module")
def model():
    return tiny_text_model("tiny:llama", num_pages=128, page_size=16)


def _stored(model, directory) -> tuple[DocKVStore, list[float]]:
    store = DocKVStore(directory, model)
    with Reranker(model, store=store) as r:
        scores = r.score(QUESTION, DOCS)
    return store, scores


def _rescore(model, store, docs=DOCS) -> tuple[Reranker, list[float]]:
    with Reranker(model, store=store) as r:
        return r, r.score(QUESTION, docs)


def _entries(store: DocKVStore) -> list:
    return sorted(store.directory.glob("*.safetensors"))


def test_files_are_standard_safetensors(model, tmp_path):
    from safetensors import safe_open

    store, _ = _stored(model, tmp_path)
    files = _entries(store)
    assert len(files) == len(DOCS)
    with safe_open(str(files[0]), framework="numpy") as f:
        key = json.loads(f.metadata()["key"])
        k = f.get_tensor("k")
    assert key["model"] == "tiny:llama" and key["dtype"] == "float32" and k.dtype == np.float32
    assert k.shape == (key["layers"], key["tokens"], key["kv_heads"], key["head_dim"])
    per_token = sum(p.stat().st_size for p in files) / sum(
        json.loads(safe_open(str(p), "numpy").metadata()["key"])["tokens"] for p in files
    )
    assert store.bytes_per_token() <= per_token < store.bytes_per_token() + 100


def test_edited_document_is_recomputed(model, tmp_path):
    store, _ = _stored(model, tmp_path)
    edited = [dict(d) for d in DOCS]
    edited[2]["text"] += " It was rebuilt in 1890."
    r, scores = _rescore(model, store, edited)
    assert (r.stats.loaded, r.stats.computed) == (len(DOCS) - 1, 1)
    want = Reranker(model, mode="recompute").score(QUESTION, edited)
    np.testing.assert_allclose(scores, want, atol=1e-4)
    assert len(_entries(store)) == len(DOCS) + 1  # the old entry is another key, never read for the new text


def _bf16_model() -> TextModel:
    cfg = tiny_config("llama")
    params = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), init_params(cfg, seed=0))
    return TextModel("tiny:llama", ModelRunner(cfg, params, num_pages=128, page_size=16), CharTokenizer(cfg.vocab_size))


def test_other_weights_or_dtype_use_other_entries(model, tmp_path):
    store, _ = _stored(model, tmp_path)
    for other in (tiny_text_model("tiny:llama", seed=1, num_pages=128, page_size=16), _bf16_model()):
        other_store = DocKVStore(tmp_path, other)
        assert other_store.directory != store.directory
        r, scores = _rescore(other, other_store)
        assert (r.stats.loaded, r.stats.computed) == (0, len(DOCS))
        want = Reranker(other, mode="recompute").score(QUESTION, DOCS)
        np.testing.assert_allclose(scores, want, atol=1e-4 if other.runner.dtype == "float32" else 0.1)
    # An entry copied from another model's directory under this model's name is caught by its key.
    stranger = DocKVStore(tmp_path, tiny_text_model("tiny:llama", seed=1, num_pages=128, page_size=16))
    for src, dst in zip(_entries(stranger), _entries(store)):
        shutil.copyfile(src, dst)
    with pytest.warns(UserWarning, match="key differs"):
        r, scores = _rescore(model, store)
    assert r.stats.computed == len(DOCS)
    np.testing.assert_allclose(scores, Reranker(model, mode="recompute").score(QUESTION, DOCS), atol=1e-4)


@pytest.mark.parametrize("damage", ["truncate", "flip_data", "garble_header", "empty"])
def test_damaged_file_is_detected_and_rewritten(model, tmp_path, damage):
    store, first = _stored(model, tmp_path)
    victim = _entries(store)[1]
    raw = bytearray(victim.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "flip_data":
        raw[-7] ^= 0x40
    elif damage == "garble_header":
        raw[8:20] = b"not json at!"
    else:
        raw = bytearray()
    victim.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="unusable"):
        r, scores = _rescore(model, store)
    assert (r.stats.loaded, r.stats.computed, store.corrupt) == (len(DOCS) - 1, 1, 1)
    np.testing.assert_allclose(scores, first, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten entry is whole again
        r, _ = _rescore(model, store)
    assert r.stats.loaded == len(DOCS)


def test_random_damage_never_gives_wrong_kv(model, tmp_path):
    """Any truncation or byte flip: the load either fails cleanly (warning, None) or returns the exact K/V."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    store = DocKVStore(tmp_path, model)
    cfg = model.runner.cfg
    key = store.key("0" * 64, 160, "p", list(range(9)))
    rng = np.random.default_rng(0)
    k, v = (
        rng.standard_normal((cfg.num_layers, 9, cfg.num_kv_heads, cfg.head_dim)).astype(np.float32) for _ in range(2)
    )
    store.save(key, k, v)
    pristine = store.path(key).read_bytes()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.integers(0, len(pristine) - 1), st.integers(1, 255), st.booleans())
    def damage(pos, flip, truncate):
        raw = bytearray(pristine)
        if truncate:
            raw = raw[:pos]
        else:
            raw[pos] ^= flip
        store.path(key).write_bytes(bytes(raw))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            got = store.load(key)
        if got is not None:
            np.testing.assert_array_equal(got[0], k)
            np.testing.assert_array_equal(got[1], v)

    damage()
