"""The decoder's projection (``[out, in]`` kernels): both product forms against a numpy reference, the form choice,
and greedy tokens that do not depend on it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder import linear
from specrag_jax.models.decoder.linear import (
    Linear,
    few_rows_form,
    head_few_rows_form,
    head_logits,
    padded_rows,
    project,
)
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.generation import greedy_generate


@pytest.fixture
def force_form(monkeypatch):
    """``force_form(True)``: every product under SMALL_ROWS rows (the output head's from 2 rows) takes the few-rows
    form; False: none does."""

    def force(on: bool) -> None:
        monkeypatch.setattr(linear, "FEW_ROWS_FORM", on)
        monkeypatch.setattr(linear, "LARGE_KERNEL_BYTES", 0)
        monkeypatch.setattr(linear, "WIDE_HEAD_IN", 0)  # the output head too
        jax.clear_caches()

    yield force
    jax.clear_caches()


def both_forms(fn, args, switches: dict, want_form: bool) -> list:
    """``fn(*args)`` with the form off, then on (``linear``'s ``switches`` set, restored after): each side traced
    freshly (jit would reuse the other side's trace of ``fn`` itself) and checked to take the form it should."""
    outs = []
    for on in (False, True):
        saved = {name: getattr(linear, name) for name in switches}
        for name, value in switches.items():
            setattr(linear, name, on if value is None else value)
        try:
            outs.append(jax.jit(lambda *a: fn(*a))(*args))
            assert took_form(fn, *args) is (on and want_form and jax.default_backend() == "cpu")
        finally:
            for name, value in saved.items():
                setattr(linear, name, value)
    return outs


def took_form(fn, *args) -> bool:
    """Whether ``fn`` traced to the few-rows form (its optimization barrier) for these arguments."""
    return "optimization_barrier" in str(jax.make_jaxpr(lambda *a: fn(*a))(*args))  # a fresh trace


@settings(max_examples=30, deadline=None)
@given(
    rows=st.sampled_from([1, 2, 5, 7, 12, 16, 47, 48, 49, 80]),
    n_in=st.integers(1, 70),
    n_out=st.integers(1, 70),
    bf16=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_both_forms_equal_the_reference(rows, n_in, n_out, bf16, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n_in), dtype=np.float32)
    w = rng.standard_normal((n_out, n_in), dtype=np.float32)
    dtype = jnp.bfloat16 if bf16 else jnp.float32
    want = np.asarray(jnp.asarray(x, dtype), np.float64) @ np.asarray(jnp.asarray(w, dtype), np.float64).T
    tol = 0.1 if bf16 else 1e-4
    args = (jnp.asarray(x, dtype), jnp.asarray(w))
    switches = {"FEW_ROWS_FORM": None, "LARGE_KERNEL_BYTES": 0}
    for got in both_forms(project, args, switches, rows < linear.SMALL_ROWS):
        assert got.shape == (rows, n_out) and got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * max(1, n_in) ** 0.5)


def test_adversarial_values_survive_the_transposed_form():
    """Infinities, NaN and huge/tiny magnitudes come out where the reference puts them."""
    x = np.array([[np.inf, 0.0, 1.0], [1e30, -1e30, 1e-30], [np.nan, 1.0, 1.0]], np.float32)
    w = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [1e-30, 1e30, 0.0]], np.float32)
    linear.FEW_ROWS_FORM, saved = True, linear.LARGE_KERNEL_BYTES
    linear.LARGE_KERNEL_BYTES = 0
    try:
        got = np.asarray(jax.jit(lambda a, b: project(a, b))(jnp.asarray(x), jnp.asarray(w)))
    finally:
        linear.LARGE_KERNEL_BYTES = saved
    with np.errstate(all="ignore"):
        want = x @ w.T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5)


def test_form_choice_follows_rows_and_kernel_size():
    big, small = linear.LARGE_KERNEL_BYTES, 1 << 20
    on_cpu = jax.default_backend() == "cpu"
    assert few_rows_form(1, small) is on_cpu  # one row: always
    k = linear.SMALL_KERNEL_ROWS
    assert few_rows_form(k, small) is on_cpu and not few_rows_form(k + 1, small)  # a drafter's batch of drafts
    assert few_rows_form(16, big) is on_cpu and not few_rows_form(16, small)
    assert not few_rows_form(linear.SMALL_ROWS, big) and not few_rows_form(512, big)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.sampled_from([1, 2, 5, 6, 9, 16, 47, 48]),
    hidden=st.integers(1, 40),
    vocab=st.integers(1, 90),
    bf16=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_head_logits_both_forms_equal_the_reference(rows, hidden, vocab, bf16, seed):
    """The output head's product in float32 from a float32 or bfloat16 table, either form."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((rows, hidden), dtype=np.float32)
    table = jnp.asarray(rng.standard_normal((vocab, hidden), dtype=np.float32), jnp.bfloat16 if bf16 else jnp.float32)
    want = np.asarray(jnp.asarray(h, table.dtype), np.float64) @ np.asarray(table, np.float64).T
    tol = 0.05 if bf16 else 1e-4
    switches = {"WIDE_HEAD_IN": 0, "HEAD_FEW_ROWS_FORM": None}
    for got in both_forms(head_logits, (jnp.asarray(h), table), switches, 1 < rows < linear.SMALL_ROWS):
        assert got.shape == (rows, vocab) and got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * max(1, hidden) ** 0.5)


def test_head_form_choice_follows_rows_and_width():
    on_cpu = jax.default_backend() == "cpu"
    wide, narrow = linear.WIDE_HEAD_IN, 576
    assert not head_few_rows_form(1, wide)  # one row: equal cost, the plain form
    assert head_few_rows_form(16, wide) is on_cpu and not head_few_rows_form(16, narrow)
    assert not head_few_rows_form(linear.SMALL_ROWS, wide)


def test_few_rows_products_run_at_8_or_16_rows():
    assert [padded_rows(r) for r in range(1, 20)] == [1, 2, 3, 4] + [8] * 4 + [16] * 8 + [17, 18, 19]
    linear.PAD_FEW_ROWS = False
    try:
        assert [padded_rows(r) for r in (5, 12)] == [5, 12]
    finally:
        linear.PAD_FEW_ROWS = True


@pytest.mark.parametrize("rows", [5, 7, 9, 15])
@pytest.mark.parametrize("shape", [(576, 576), (1536, 576), (30, 70)])
def test_padding_rows_leaves_each_row_as_it_was(rows, shape, force_form):
    """The zero rows a few-rows product is padded with change neither the shape nor the real rows' values."""
    force_form(True)
    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.standard_normal((rows, shape[1]), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
    got, padded = {}, f"f32[{padded_rows(rows)},{shape[1]}]"
    for pad in (True, False):
        linear.PAD_FEW_ROWS = pad
        try:
            assert (padded in str(jax.make_jaxpr(lambda a, b: project(a, b))(x, w))) is pad  # a fresh trace
            got[pad] = np.asarray(jax.jit(lambda a, b: project(a, b))(x, w))
        finally:
            linear.PAD_FEW_ROWS = True
    assert got[True].shape == (rows, shape[0])
    np.testing.assert_allclose(got[True], got[False], rtol=1e-6, atol=1e-6)


def test_linear_kernel_is_out_in_with_bias():
    module = Linear(7, use_bias=True)
    variables = module.init(jax.random.PRNGKey(0), jnp.zeros((3, 5)))
    assert variables["params"]["kernel"].shape == (7, 5) and variables["params"]["bias"].shape == (7,)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5)), jnp.float32)
    k, b = variables["params"]["kernel"], jnp.arange(7.0)
    y = module.apply({"params": {"kernel": k, "bias": b}}, x)
    np.testing.assert_allclose(y, np.asarray(x) @ np.asarray(k).T + np.arange(7.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_greedy_tokens_do_not_depend_on_the_form(arch, force_form):
    """A batch of 5 prompts (5-row decode steps, a longer prefill) decodes the same tokens either way."""
    cfg = tiny_config(arch)
    prompts = [[5 + (i * 7 + j) % 60 for j in range(3 + 5 * i)] for i in range(5)]
    out = {}
    for on in (False, True):
        force_form(on)
        r = ModelRunner(cfg, init_params(cfg, seed=2), num_pages=64, page_size=4, max_seq_len=64)
        out[on] = greedy_generate(r, prompts, 12)
    assert out[True] == out[False]


def test_greedy_tokens_do_not_depend_on_row_padding(force_form, monkeypatch):
    """Six prompts (6-row decode steps, run at 8 rows) decode the same tokens with and without the padding."""
    cfg = tiny_config("llama")
    prompts = [[5 + (i * 7 + j) % 60 for j in range(3 + 4 * i)] for i in range(6)]
    force_form(True)
    out = {}
    for pad in (False, True):
        monkeypatch.setattr(linear, "PAD_FEW_ROWS", pad)
        jax.clear_caches()
        r = ModelRunner(cfg, init_params(cfg, seed=3), num_pages=64, page_size=4, max_seq_len=64)
        out[pad] = greedy_generate(r, prompts, 12)
    assert out[True] == out[False]
