"""LoRA on the fly: starts at the base, equals the merged weights, and its gradients are right."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.decoder.transformer import stack_layers, unstack_layers
from specrag_jax.training.batching import make_batch, pack_rows
from specrag_jax.training.lora import LoraConfig, init_lora, lora_delta, merge_lora, parse_targets
from specrag_jax.training.objective import mean_loss, row_logits
from tests.training.conftest import BATCH_KEYS, counting_examples

LORA = LoraConfig(rank=3, alpha=6.0, targets=("q", "v", "o", "up", "down"))


@pytest.fixture(scope="module")
def setup(tiny):
    cfg, stacked = tiny
    params = unstack_layers(stacked, cfg.num_layers)
    adapter = init_lora(cfg, LORA, jax.random.PRNGKey(0))
    # A trained-looking adapter: B != 0 (at init B = 0 and the gradient of A vanishes).
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 64))
    adapter = jax.tree_util.tree_map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), adapter)
    rows = pack_rows(counting_examples(6, seed=5), 64, 4)
    batch = make_batch(rows, len(rows), 64)
    arrays = {k: jnp.asarray(getattr(batch, k)) for k in BATCH_KEYS}
    return cfg, stacked, params, adapter, arrays


def _logits(cfg, trainable, frozen, arrays, mode):
    fn = jax.jit(functools.partial(row_logits, cfg=cfg, mode=mode, lora_scale=LORA.scale, max_segments=4))
    return np.asarray(fn(trainable, frozen, batch=arrays))


def test_fresh_adapter_is_the_base_model(setup):
    cfg, _, params, _, arrays = setup
    fresh = init_lora(cfg, LORA, jax.random.PRNGKey(3))
    np.testing.assert_array_equal(
        _logits(cfg, fresh, params, arrays, "lora"), _logits(cfg, params, None, arrays, "full")
    )


def test_on_the_fly_equals_merged_in_either_layout(setup):
    cfg, stacked, params, adapter, arrays = setup
    on_the_fly = _logits(cfg, adapter, params, arrays, "lora")
    merged = merge_lora(params, adapter, LORA)
    np.testing.assert_allclose(_logits(cfg, merged, None, arrays, "full"), on_the_fly, atol=2e-5)
    merged_stacked = merge_lora(stacked, adapter, LORA)
    assert set(merged_stacked) == set(stacked)
    jax.tree_util.tree_map(np.testing.assert_array_equal, stack_layers(merged, cfg.num_layers), merged_stacked)
    untouched = params["layers_1"]["attn"]["k"]["kernel"]  # not a target
    assert merged["layers_1"]["attn"]["k"]["kernel"] is untouched


def test_stacked_merge_of_some_layers_leaves_the_others_and_refuses_a_missing_layer(setup):
    cfg, stacked, params, adapter, _ = setup
    some = {"layers_1": adapter["layers_1"]}
    merged = merge_lora(stacked, some, LORA)
    per_layer = stack_layers(merge_lora(params, some, LORA), cfg.num_layers)
    jax.tree_util.tree_map(np.testing.assert_array_equal, per_layer, merged)
    q = merged["layers"]["attn"]["q"]["kernel"]
    np.testing.assert_array_equal(q[0], stacked["layers"]["attn"]["q"]["kernel"][0])
    assert not np.array_equal(q[1], stacked["layers"]["attn"]["q"]["kernel"][1])
    with pytest.raises(SpecRagError, match="'layers_9' is past the model's"):
        merge_lora(stacked, {"layers_9": adapter["layers_1"]}, LORA)


def _loss_fn(cfg, params, arrays):
    return jax.jit(lambda a: mean_loss(a, params, cfg, arrays, mode="lora", lora_scale=LORA.scale, max_segments=4))


def test_gradients_match_central_finite_differences(setup):
    cfg, _, params, adapter, arrays = setup
    loss = _loss_fn(cfg, params, arrays)
    grads = jax.jit(
        jax.grad(lambda a: mean_loss(a, params, cfg, arrays, mode="lora", lora_scale=LORA.scale, max_segments=4))
    )(adapter)
    flat, unravel = jax.flatten_util.ravel_pytree(adapter)
    g = np.asarray(jax.flatten_util.ravel_pytree(grads)[0])
    rng = np.random.default_rng(0)
    eps = 3e-3  # truncation error ~eps^2, float32 rounding ~1e-7 * loss / eps: both well inside the bound
    # Coordinates: the largest gradients plus random ones, and random directions through all adapters.
    coords = list(np.argsort(-np.abs(g))[:4]) + list(rng.choice(g.size, 4, replace=False))
    directions = [np.eye(1, g.size, c)[0] for c in coords] + [rng.normal(size=g.size) for _ in range(3)]
    for d in directions:
        d = jnp.asarray(d / np.linalg.norm(d), jnp.float32)
        fd = (float(loss(unravel(flat + eps * d))) - float(loss(unravel(flat - eps * d)))) / (2 * eps)
        analytic = float(np.dot(g, np.asarray(d)))
        assert abs(fd - analytic) <= 1e-3 * abs(analytic) + 2e-4, (fd, analytic)


def test_gradients_follow_the_chain_rule_through_the_merged_kernel(setup):
    """dL/dA = s dL/dW B^T and dL/dB = s A^T dL/dW, with dL/dW the full model's kernel gradient."""
    cfg, _, params, adapter, arrays = setup
    kw = dict(lora_scale=LORA.scale, max_segments=4)
    g_lora = jax.jit(jax.grad(lambda a: mean_loss(a, params, cfg, arrays, mode="lora", **kw)))(adapter)
    merged = merge_lora(params, adapter, LORA)
    g_full = jax.jit(jax.grad(lambda p: mean_loss(p, None, cfg, arrays, mode="full", **kw)))(merged)
    for layer in ("layers_0", "layers_1"):
        for group, target in (("attn", "q"), ("attn", "o"), ("mlp", "down")):
            ab, ga = adapter[layer][group][target], g_lora[layer][group][target]
            gw = g_full[layer][group][target]["kernel"].T  # the [in, out] gradient (kernels are [out, in])
            np.testing.assert_allclose(ga["a"], LORA.scale * gw @ ab["b"].T, rtol=2e-3, atol=1e-6)
            np.testing.assert_allclose(ga["b"], LORA.scale * ab["a"].T @ gw, rtol=2e-3, atol=1e-6)


def test_targets_and_config_checks(tiny):
    cfg, _ = tiny
    assert parse_targets("attn") == ("q", "k", "v", "o")
    assert parse_targets("q,mlp,q") == ("q", "gate", "up", "down")
    with pytest.raises(SpecRagError, match="unknown LoRA target 'qq'"):
        LoraConfig(targets=("qq",))
    with pytest.raises(SpecRagError, match="rank must be >= 1"):
        LoraConfig(rank=0)
    ad = init_lora(cfg, LoraConfig(2, 4.0, ("k", "gate")), jax.random.PRNGKey(0))
    assert set(ad["layers_0"]) == {"attn", "mlp"} and set(ad["layers_0"]["attn"]) == {"k"}
    assert ad["layers_0"]["attn"]["k"]["a"].shape == (cfg.hidden_size, 2)
    assert ad["layers_0"]["attn"]["k"]["b"].shape == (2, cfg.num_kv_heads * cfg.head_dim)
    assert float(jnp.abs(lora_delta(ad["layers_0"]["attn"]["k"], 2.0)).max()) == 0.0
