"""Sparse MoE block: grouped (ragged_dot) and gathered experts vs the dense all-experts reference, router
semantics and tie-breaking, one compiled program for every routing, parity with transformers' Mixtral block."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.models.decoder.moe import (
    SparseMoE,
    dense_moe_reference,
    experts_gather,
    experts_ragged,
    moe_block,
    route,
    sort_by_expert,
)

ATOL = RTOL = 1e-5


def make_params(key: jax.Array, hidden: int, experts: int, inter: int) -> dict:
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {
        "router": {"kernel": jax.random.normal(k1, (hidden, experts)) / np.sqrt(hidden)},
        "gate": {"kernel": jax.random.normal(k2, (experts, hidden, inter)) / np.sqrt(hidden)},
        "up": {"kernel": jax.random.normal(k3, (experts, hidden, inter)) / np.sqrt(hidden)},
        "down": {"kernel": jax.random.normal(k4, (experts, inter, hidden)) / np.sqrt(inter)},
    }


def force_router(params: dict, x: jax.Array, allowed: list[int], favourite: int | None) -> tuple[dict, jax.Array]:
    """Feature 0 of every token := 1; router row 0 pushes experts outside ``allowed`` far down and, when
    given, ``favourite`` far up (so every token's first choice is ``favourite``)."""
    experts = params["router"]["kernel"].shape[1]
    bias = np.full(experts, -50.0, np.float32)
    bias[allowed] = 0.0
    if favourite is not None:
        bias[favourite] = 50.0
    kernel = params["router"]["kernel"].at[0].set(jnp.asarray(bias))
    return {**params, "router": {"kernel": kernel}}, x.at[:, 0].set(1.0)


@functools.partial(jax.jit, static_argnums=2)
def _run_all(x: jax.Array, params: dict, k: int) -> tuple:
    """Routing, group sizes and the three implementations in one program (one compile per example)."""
    weights, chosen, _ = route(x, params["router"]["kernel"], k)
    sizes = sort_by_expert(chosen, params["gate"]["kernel"].shape[0])[2]
    outs = [f(x, weights, chosen, params) for f in (dense_moe_reference, experts_ragged, experts_gather)]
    return chosen, sizes, *outs


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 24),
    experts=st.integers(1, 8),
    k_two=st.booleans(),
    hidden=st.sampled_from([4, 8, 16]),
    inter=st.sampled_from([4, 8, 12]),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["random", "subset", "one"]),
    data=st.data(),
)
def test_grouped_matches_dense_reference(tokens, experts, k_two, hidden, inter, seed, mode, data):
    k = 2 if k_two and experts >= 2 else 1
    kx, kp = jax.random.split(jax.random.key(seed))
    params = make_params(kp, hidden, experts, inter)
    x = jax.random.normal(kx, (tokens, hidden))
    allowed = list(range(experts))
    if mode == "subset":  # some experts receive no tokens
        allowed = sorted(data.draw(st.sets(st.integers(0, experts - 1), min_size=k, max_size=experts)))
        params, x = force_router(params, x, allowed, None)
    elif mode == "one":  # every token's first choice is one expert
        fav = data.draw(st.integers(0, experts - 1))
        params, x = force_router(params, x, allowed, fav)
    chosen, sizes, ref, ragged, gathered = _run_all(x, params, k)
    chosen = np.asarray(chosen)
    assert int(sizes.sum()) == tokens * k and set(np.unique(chosen)) <= set(allowed)
    assert sizes.tolist() == np.bincount(chosen.ravel(), minlength=experts).tolist()
    if mode == "one":
        assert (chosen[:, 0] == fav).all() and sizes[fav] == tokens
    np.testing.assert_allclose(ragged, ref, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(gathered, ref, atol=ATOL, rtol=RTOL)


def test_all_tokens_on_one_expert_k1():
    params = make_params(jax.random.key(0), 8, 6, 12)
    params, x = force_router(params, jax.random.normal(jax.random.key(1), (10, 8)), list(range(6)), 4)
    chosen, sizes, ref, ragged, gathered = _run_all(x, params, 1)
    assert sizes.tolist() == [0, 0, 0, 0, 10, 0] and (np.asarray(chosen) == 4).all()
    np.testing.assert_allclose(ragged, ref, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(gathered, ref, atol=ATOL, rtol=RTOL)


def test_router_semantics_and_ties():
    x = jax.random.normal(jax.random.key(2), (9, 16))
    kernel = jax.random.normal(jax.random.key(3), (16, 8))
    weights, chosen, logits = route(x, kernel, 2)
    lg = np.asarray(x @ kernel)
    np.testing.assert_allclose(logits, lg, atol=1e-5)
    expect = np.argsort(-lg, axis=1, kind="stable")[:, :2]
    assert (np.asarray(chosen) == expect).all()
    top = np.take_along_axis(lg, expect, axis=1)
    soft = np.exp(top - top.max(1, keepdims=True))
    np.testing.assert_allclose(weights, soft / soft.sum(1, keepdims=True), atol=1e-6)  # softmax over the k
    assert weights.dtype == jnp.float32
    # Exact ties (a zero router): the lowest expert indices win, weights split evenly.
    w0, c0, _ = route(x, jnp.zeros((16, 8)), 3)
    assert (np.asarray(c0) == [0, 1, 2]).all() and np.allclose(w0, 1 / 3)
    # Three-way tie at the k boundary: lower index first.
    w1, c1, _ = route(jnp.ones((1, 1)), jnp.asarray([[0.0, 2.0, 1.0, 2.0, 2.0]]), 2)
    assert np.asarray(c1).tolist() == [[1, 3]]


def test_one_program_for_every_routing():
    step = jax.jit(moe_block, static_argnames=("top_k", "dtype", "impl"))
    compiles: list[str] = []

    def listener(name, _duration, **_kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    inputs = []
    for i in range(6):  # built before counting: their own eager ops compile too
        xi = jax.random.normal(jax.random.key(10 + i), (32, 16))
        p = make_params(jax.random.key(20 + i), 16, 8, 24)
        if i % 2:  # skewed routings: one expert takes every token, most take none
            p, xi = force_router(p, xi, [i, (i + 1) % 8], i)
        inputs.append((xi, p))
    step(*inputs[0], top_k=2).block_until_ready()  # the one compilation
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for xi, p in inputs[1:]:
            step(xi, p, top_k=2).block_until_ready()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == [] and step._cache_size() == 1


def test_linen_module_names_and_impls():
    x = jax.random.normal(jax.random.key(6), (2, 5, 16))
    module = SparseMoE(num_experts=4, top_k=2, intermediate_size=24)
    variables = module.init(jax.random.key(7), x)
    shapes = jax.tree.map(lambda a: a.shape, variables["params"])
    assert shapes == {
        "router": {"kernel": (16, 4)},
        "gate": {"kernel": (4, 16, 24)},
        "up": {"kernel": (4, 16, 24)},
        "down": {"kernel": (4, 24, 16)},
    }
    out = module.apply(variables, x)
    assert out.shape == x.shape
    gathered = SparseMoE(num_experts=4, top_k=2, intermediate_size=24, impl="gather").apply(variables, x)
    np.testing.assert_allclose(out, gathered, atol=ATOL, rtol=RTOL)
    with pytest.raises(ValueError, match="unknown MoE implementation"):
        moe_block(x, variables["params"], 2, impl="dense")


def hf_block(experts_impl: str, dtype_name: str, hidden: int = 32, inter: int = 48, experts: int = 8, k: int = 2):
    """A seeded transformers MixtralSparseMoeBlock, an input, its output and routing, and our parameters."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = transformers.MixtralConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_local_experts=experts,
        num_experts_per_tok=k,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    )
    cfg._experts_implementation = experts_impl
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():  # the block's expert tensors start uninitialised (torch.empty)
            p.normal_(0.0, 0.2)
        block = block.to(getattr(torch, dtype_name))
        x_t = torch.randn(3, 11, hidden).to(getattr(torch, dtype_name))
        out_t = block(x_t)
        _, scores_t, idx_t = block.gate(x_t)
    f32 = lambda t: t.detach().float().numpy()  # noqa: E731
    gate_up = f32(block.experts.gate_up_proj)  # [E, 2I, H]: w1 rows then w3 rows
    params = {
        "router": {"kernel": jnp.asarray(f32(block.gate.weight).T)},
        "gate": {"kernel": jnp.asarray(gate_up[:, :inter].transpose(0, 2, 1))},
        "up": {"kernel": jnp.asarray(gate_up[:, inter:].transpose(0, 2, 1))},
        "down": {"kernel": jnp.asarray(f32(block.experts.down_proj).transpose(0, 2, 1))},
    }
    x = jnp.asarray(f32(x_t)).astype(dtype_name)
    return x, params, f32(out_t), f32(scores_t), idx_t.numpy()


@pytest.mark.parametrize("experts_impl", ["eager", "grouped_mm", "batched_mm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parity_with_transformers_mixtral_block(experts_impl, dtype):
    x, params, out_t, scores_t, idx_t = hf_block(experts_impl, dtype)
    weights, chosen, _ = route(x.reshape(-1, x.shape[-1]), params["router"]["kernel"], 2, jnp.dtype(dtype))
    assert (np.asarray(chosen) == idx_t).all()  # the same experts, in the same order, every token
    np.testing.assert_allclose(weights, scores_t, atol=1e-6)
    # bfloat16: within 2 bf16 ulps of outputs up to ~3.5 (intermediate roundings differ from torch's)
    tol = {"atol": ATOL, "rtol": RTOL} if dtype == "float32" else {"atol": 4e-2, "rtol": 1e-2}
    for impl in ("ragged", "gather"):
        out = jax.jit(moe_block, static_argnums=(2, 3), static_argnames=("impl",))(
            x, params, 2, jnp.dtype(dtype), impl=impl
        )
        assert out.dtype == jnp.dtype(dtype)
        np.testing.assert_allclose(np.asarray(out, np.float32), out_t, **tol)
