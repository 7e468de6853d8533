"""The functional entry (``FunctionalModel``): logits and log-probabilities equal the engine's for the same tokens
(tiny random models of three families, ragged and padded batches, then the real SmolLM2), and the functions work
under the caller's ``jax.jit`` (one program per shape) and ``jax.grad`` (finite, matching finite differences)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import Decoder, init_params
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.functional import FunctionalModel

BATCH, WIDTH = 3, 24  # the hypothesis test's one padded shape


@pytest.fixture(scope="module", params=["llama", "gemma3", "qwen2"])
def pair(request) -> tuple[FunctionalModel, ModelRunner]:
    """The same random weights as a functional model and as the engine's runner (gemma3: sliding window 8)."""
    cfg = tiny_config(request.param, tie_embeddings=request.param == "gemma3")
    params = init_params(cfg, seed=3)
    runner = ModelRunner(cfg, params, num_pages=8, page_size=4, max_seq_len=256)
    return FunctionalModel.from_config(cfg, params), runner


_JITTED: dict = {}


def jitted(fm: FunctionalModel, name: str):
    """``jax.jit(getattr(fm, name))``, made once per model: as a caller would, not a fresh jit per call."""
    key = (id(fm), name)
    if key not in _JITTED:
        _JITTED[key] = (fm, jax.jit(getattr(fm, name)))
    return _JITTED[key][1]


def _fixed(n: int | None) -> dict:
    """``pack`` arguments that pad a step to ``n`` tokens, sequences and rows (one engine program per test)."""
    return {} if n is None else {"token_bucket": n, "min_seqs": n}


def engine_logits(runner: ModelRunner, seqs: list[list[int]], fixed: int | None = None) -> list[np.ndarray]:
    """The engine's logits at every position of each sequence, all sequences in one packed step."""
    chunks = [Chunk([], 0, s, write=False, rows=list(range(len(s)))) for s in seqs]
    out = runner.logits(runner.pack(chunks, **_fixed(fixed)))
    ends = np.cumsum([len(s) for s in seqs])
    return np.split(out, ends[:-1])


def engine_log_probs(runner: ModelRunner, seqs: list[list[int]], fixed: int | None = None) -> list[np.ndarray]:
    """The engine's scores: log p(s[t] | s[:t]) for t >= 1 of each sequence."""
    chunks = [Chunk([], 0, s, write=False, rows=list(range(len(s) - 1))) for s in seqs]
    out = runner.score(runner.pack(chunks, **_fixed(fixed)), [t for s in seqs for t in s[1:]])
    return np.split(out, np.cumsum([len(s) - 1 for s in seqs])[:-1])


def padded(seqs: list[list[int]], width: int, left: bool) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = np.zeros((len(seqs), width), np.int32), np.zeros((len(seqs), width), bool)
    for i, s in enumerate(seqs):
        span = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, span], mask[i, span] = s, True
    return ids, mask


def random_seqs(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


@pytest.mark.parametrize("shape", [(1, 1), (2, 9), (1, 40)])
def test_unpadded_logits_equal_the_engines(pair, shape):
    fm, runner = pair
    seqs = random_seqs(fm.config.vocab_size, [shape[1]] * shape[0], seed=shape[1])
    got = np.asarray(jitted(fm, "logits")(fm.params, np.asarray(seqs, np.int32)))
    for row, want in zip(got, engine_logits(runner, seqs)):
        np.testing.assert_allclose(row, want, atol=2e-5, rtol=1e-5)


@settings(max_examples=6, deadline=None)
@given(
    lengths=st.lists(st.integers(1, WIDTH), min_size=BATCH, max_size=BATCH),
    left=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_ragged_padded_batches_equal_the_engine(pair, lengths, left, seed):
    """Right- or left-padded rows of any lengths: each row's logits and log-probabilities are the engine's for
    that sequence alone, on one compiled shape."""
    fm, runner = pair
    seqs = random_seqs(fm.config.vocab_size, lengths, seed)
    ids, mask = padded(seqs, WIDTH, left)
    logits = np.asarray(jitted(fm, "logits")(fm.params, ids, mask))
    logp = np.asarray(jitted(fm, "token_log_probs")(fm.params, ids, mask))
    fixed = BATCH * WIDTH
    engine = zip(engine_logits(runner, seqs, fixed), engine_log_probs(runner, seqs, fixed))
    for i, (want, want_lp) in enumerate(engine):
        np.testing.assert_allclose(logits[i][mask[i]], want, atol=2e-5, rtol=1e-5)
        assert np.all(logits[i][~mask[i]] == 0)
        np.testing.assert_allclose(logp[i][mask[i]][1:], want_lp, atol=2e-5, rtol=1e-5)
        assert logp[i][mask[i]][0] == 0 and np.all(logp[i][~mask[i]] == 0)


def test_sequence_log_prob_is_the_engines_answer_score(pair):
    fm, runner = pair
    prompts = random_seqs(fm.config.vocab_size, [7, 3], seed=1)
    answers = random_seqs(fm.config.vocab_size, [4, 9], seed=2)
    ids, mask, target = fm.prompt_answer_batch(prompts, answers, length=16)
    got = np.asarray(jax.jit(fm.sequence_log_prob)(fm.params, ids, target, mask))
    for i, (p, a) in enumerate(zip(prompts, answers)):
        scores = engine_log_probs(runner, [p + a])[0]
        assert got[i] == pytest.approx(scores[len(p) - 1 :].sum(), abs=1e-4)


def test_the_module_and_params_are_the_engines_decoder(pair):
    fm, _ = pair
    assert isinstance(fm.module, Decoder) and fm.module.attention_impl == "dense"
    assert {f"layers_{i}" for i in range(fm.config.num_layers)} <= set(fm.params)
    ids = jnp.asarray([[5, 6, 7]], jnp.int32)
    assert jax.jit(fm.hidden_states)(fm.params, ids).shape == (1, 3, fm.config.hidden_size)


def test_one_program_per_shape_under_the_callers_jit(pair):
    fm, _ = pair
    logits, score = jax.jit(fm.logits), jax.jit(fm.sequence_log_prob)
    for seed in range(3):
        seqs = random_seqs(fm.config.vocab_size, [10, 4], seed)
        ids, mask, target = fm.prompt_answer_batch([s[:3] for s in seqs], [s[3:] for s in seqs], length=12)
        logits(fm.params, ids, mask).block_until_ready()
        score(fm.params, ids, target, mask).block_until_ready()
    assert logits._cache_size() == 1 and score._cache_size() == 1


def test_vmap_over_a_leading_axis_is_each_slice(pair):
    fm, _ = pair
    ids = np.random.default_rng(0).integers(0, fm.config.vocab_size, (2, 3, 8)).astype(np.int32)
    stacked = jax.jit(jax.vmap(fm.logits, in_axes=(None, 0)))(fm.params, ids)
    np.testing.assert_allclose(np.asarray(stacked[1]), np.asarray(jitted(fm, "logits")(fm.params, ids[1])), atol=1e-6)


def test_gradient_is_finite_nonzero_and_matches_finite_differences(pair):
    fm, _ = pair
    ids, mask, target = fm.prompt_answer_batch([[5, 9, 14, 3], [8, 8]], [[21, 4, 60], [33, 2, 71, 12]])

    def objective(params):
        return jnp.sum(fm.sequence_log_prob(params, ids, target, mask))

    value, grads = jax.jit(jax.value_and_grad(objective))(fm.params)
    objective_jit = jax.jit(objective)
    leaves = jax.tree_util.tree_leaves(grads)
    assert np.isfinite(float(value)) and all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert all(np.abs(np.asarray(g)).max() > 0 for g in leaves)  # every parameter reaches the answer's score
    # One direction: a random unit perturbation of layer 0's query projection.
    q = fm.params["layers_0"]["attn"]["q"]["kernel"]
    direction = jax.random.normal(jax.random.PRNGKey(0), q.shape)
    direction = direction / jnp.linalg.norm(direction)

    def along(eps):
        p = jax.tree_util.tree_map(lambda a: a, fm.params)  # new dicts, same arrays
        p["layers_0"]["attn"]["q"]["kernel"] = q + eps * direction
        return float(objective_jit(p))

    eps = 1e-2
    numeric = (along(eps) - along(-eps)) / (2 * eps)
    analytic = float(jnp.sum(grads["layers_0"]["attn"]["q"]["kernel"] * direction))
    assert abs(analytic) > 1e-3
    assert numeric == pytest.approx(analytic, rel=2e-2, abs=1e-3)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda fm: fm.logits(fm.params, np.asarray([1, 2, 3])), "rank 2"),
        (lambda fm: fm.logits(fm.params, np.asarray([[1, fm.config.vocab_size]])), "outside the vocabulary"),
        (lambda fm: fm.logits(fm.params, np.asarray([[-1, 4]])), "token id -1"),
        (lambda fm: fm.logits(fm.params, np.asarray([[1.0, 2.0]])), "integers"),
        (lambda fm: fm.logits(fm.params, np.ones((1, 3), np.int32), np.ones((1, 2), bool)), "mask has shape"),
        (lambda fm: fm.sequence_log_prob(fm.params, np.ones((1, 3), np.int32), np.ones(3, bool)), "target_mask"),
        (lambda fm: fm.prompt_answer_batch([[1, 2]], [[3]], length=2), "more than length=2"),
        (lambda fm: fm.prompt_answer_batch([[1, 2]], []), "as many prompts as answers"),
    ],
)
def test_bad_input_is_a_one_line_error_naming_it(pair, call, words):
    fm, _ = pair
    with pytest.raises(ValueError, match=words) as err:
        call(fm)
    assert isinstance(err.value, SpecRagError) and "\n" not in str(err.value)


def test_rank_is_checked_under_jit_too(pair):
    fm, _ = pair
    with pytest.raises(SpecRagError, match="rank 2"):
        jax.jit(fm.logits)(fm.params, jnp.ones((2, 3, 4), jnp.int32))


@pytest.mark.slow
def test_real_smollm2_logits_equal_the_engines():
    from specrag_jax.models.text_model import TextModel

    name = "smollm2-135m-instruct"
    fm = FunctionalModel.load(name)
    engine = TextModel.load(name, max_seq_len=256, max_batch=1)
    prompt = fm.tokenizer.encode("Question: How do I leave a loop early in Python?\nAnswer:", add_special_tokens=True)
    answer = fm.tokenizer.encode(" Use the break statement, which ends the nearest enclosing loop.")
    ids = prompt + answer
    want = engine_logits(engine.runner, [ids])[0]
    batch, mask, target = fm.prompt_answer_batch([prompt, prompt[:5]], [answer, answer[:3]])  # a padded 2nd row
    got = np.asarray(jax.jit(fm.logits)(fm.params, batch, mask))[0]
    diff = np.abs(got - want).max()
    print(f"max |functional - engine| over {len(ids)} positions x {want.shape[1]} vocab: {diff:.2e}")
    assert diff <= 1e-4
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    score = float(jax.jit(fm.sequence_log_prob)(fm.params, batch, target, mask)[0])
    assert score == pytest.approx(engine_log_probs(engine.runner, [ids])[0][len(prompt) - 1 :].sum(), abs=1e-3)
