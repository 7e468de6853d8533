"""Token-tree speculative generation on tiny random models: greedy exactness, K/V after acceptance, page
accounting, and (statistically) sampling losslessness end to end."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.runner import Chunk, ModelRunner
from specrag_jax.models.generation import Generator, Phase
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation, combine_stats
from specrag_jax.models.speculative.ngram_proposer import NgramProposer
from specrag_jax.models.speculative.tree import build_tree, stack_trees

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [3, 4], [20 + i for i in range(13)]]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    cfg = tiny_config(request.param, tie_embeddings=request.param == "gemma3")
    return cfg, init_params(cfg, seed=1)


def runner(model, **kw):
    cfg, params = model
    kw.setdefault("num_pages", 128)
    kw.setdefault("page_size", 4)
    kw.setdefault("max_seq_len", 256)
    return ModelRunner(cfg, params, **kw)


def oracle_proposers(prompts, continuations, wrong=(1, 2, 3)):
    """Per prompt: the true continuation's next tokens (after a wrong branch, so the accepted path is not at
    chunk indices 1..n) plus a wrong branch."""

    def make(full):
        return lambda ctx: [list(wrong), full[len(ctx) : len(ctx) + 6], full[len(ctx) : len(ctx) + 2] + [0]]

    return [make(p + c) for p, c in zip(prompts, continuations)]


@pytest.mark.parametrize("kind", ["ngram", "oracle", "random"])
def test_greedy_speculation_equals_plain_greedy(model, kind):
    r = runner(model)
    plain = Generator(r).generate(PROMPTS, max_new_tokens=30)
    rng = np.random.default_rng(0)
    proposer = {
        "ngram": NgramProposer(),
        "oracle": oracle_proposers(PROMPTS, [x.token_ids for x in plain]),
        "random": lambda ctx: [rng.integers(0, 97, 4).tolist() for _ in range(3)],
    }[kind]
    spec = Generator(r, speculation=Speculation(proposer, 16)).generate(PROMPTS, max_new_tokens=30)
    assert [x.token_ids for x in spec] == [x.token_ids for x in plain]
    np.testing.assert_allclose([x.logprobs for x in spec], [x.logprobs for x in plain], atol=1e-4)
    assert r.allocator.num_free == r.allocator.num_usable
    stats = combine_stats([x.speculation for x in spec])
    if kind == "oracle":  # the right branch is there every step: many tokens per verifier step
        assert stats["accepted_tokens_per_step"] > 3.5
    assert stats["steps"] <= sum(len(x.token_ids) - 1 for x in spec)


def test_speculation_respects_eos_stop_and_length(model):
    r = runner(model)
    plain = Generator(r).generate(PROMPTS, max_new_tokens=20)
    stop_at = {row: x.token_ids[6] for row, x in enumerate(plain)}
    stop_fn = lambda row, out: out[-1] == stop_at[row]  # noqa: E731
    a = Generator(r).generate(PROMPTS, max_new_tokens=20, stop_fn=stop_fn)
    prop = oracle_proposers(PROMPTS, [x.token_ids for x in plain])
    b = Generator(r, speculation=Speculation(prop, 16)).generate(PROMPTS, max_new_tokens=20, stop_fn=stop_fn)
    assert [(x.token_ids, x.finish_reason) for x in a] == [(x.token_ids, x.finish_reason) for x in b]
    c = Generator(r, speculation=Speculation(prop, 16)).generate(PROMPTS, max_new_tokens=5)
    assert [x.token_ids for x in c] == [x.token_ids[:5] for x in plain]
    assert r.allocator.num_free == r.allocator.num_usable


def test_phases_with_speculation_equal_plain_phases(model):
    r = runner(model)
    phases = [Phase(8), Phase(10)]
    between = lambda p, row, res: (3, [40, 41])  # noqa: E731
    plain = Generator(r).generate_phases([5, 6], [[7, 8], [9]], phases, between)
    spec = Generator(r, speculation=Speculation(NgramProposer(), 8)).generate_phases(
        [5, 6], [[7, 8], [9]], phases, between
    )
    assert [[x.token_ids for x in ph] for ph in spec] == [[x.token_ids for x in ph] for ph in plain]
    assert r.allocator.num_free == r.allocator.num_usable


@pytest.mark.parametrize("page_size", [2, 3])
def test_kv_after_acceptance_equals_fresh_prefill(model, page_size):
    """Two sequences, one tree step whose accepted path sits at scattered chunk indices and crosses pages: the
    next step's logits equal those of a fresh prefill of prompt + accepted tokens + bonus."""
    r = runner(model, page_size=page_size)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17]]
    plain = Generator(r).generate(prompts, max_new_tokens=8)
    pages, trees, chunks = [], [], []
    for p, res in zip(prompts, plain):
        pg = r.allocator.allocate(-(-(len(p) + 24) // page_size))
        pages.append(pg)
        r.score(r.pack([Chunk(pg, 0, p, rows=[len(p) - 1])]), [0])
        truth = res.token_ids
        # root = first generated token; the true branch comes after two wrong ones.
        tree = build_tree([[90, 91], [92], truth[1:6], truth[1:3] + [93]], truth[0], 16)
        trees.append(tree)
        chunks.append(Chunk(pg, len(p), tree.tokens, parents=tree.parents, positions=tree.positions(len(p))))
    step = r.pack(chunks, token_bucket=2 * 16, min_seqs=2)
    path, n, tokens, *_ = r.speculate(step, stack_trees(trees), SamplingBatch.of([SamplingParams()] * 2, [1, 1]))
    assert list(n) == [5, 5] and all(tokens[i, :6].tolist() == plain[i].token_ids[1:7] for i in range(2))
    assert any(int(path[i, k]) != k for i in range(2) for k in range(1, 6))  # compaction really moved K/V
    for p, res, pg in zip(prompts, plain, pages):
        accepted = [res.token_ids[0]] + res.token_ids[1:6]  # root + 5 accepted, K/V cached; bonus is next
        bonus = res.token_ids[6]
        after = r.logits(r.pack([Chunk(pg, len(p) + 6, [bonus], rows=[0])]))
        fresh_pages = r.allocator.allocate(-(-(len(p) + 8) // page_size))
        fresh = r.logits(r.pack([Chunk(fresh_pages, 0, p + accepted + [bonus], rows=[len(p) + 6])]))
        np.testing.assert_allclose(after, fresh, atol=1e-5)
        r.allocator.release(fresh_pages)
        r.allocator.release(pg)
    assert r.allocator.num_free == r.allocator.num_usable


def test_no_page_leak_when_the_proposer_fails_mid_generation(model):
    r = runner(model)
    calls = []

    def failing(ctx):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("proposer broke")
        return [[1, 2, 3]]

    with pytest.raises(SpecRagError, match="proposer broke"):
        Generator(r, speculation=Speculation(failing, 16)).generate(PROMPTS, max_new_tokens=30)
    assert r.allocator.num_free == r.allocator.num_usable
    with pytest.raises(SpecRagError, match="outside the vocabulary"):
        Generator(r, speculation=Speculation(lambda ctx: [[5000]], 16)).generate(PROMPTS, max_new_tokens=30)
    assert r.allocator.num_free == r.allocator.num_usable


@pytest.mark.parametrize("budget", [0, 7, 128, "16"])
def test_tree_budget_out_of_range_is_one_line_error(budget):
    with pytest.raises(SpecRagError, match="tree budget must be one of 8, 16, 32, 64"):
        Speculation(NgramProposer(), budget)


def test_non_callable_proposer_is_one_line_error():
    with pytest.raises(SpecRagError, match="must be callable"):
        Speculation("ngram", 16)


def _first_tokens(r, prompt, speculation, n, seed0):
    sp = [SamplingParams(temperature=1.0, top_k=4, seed=seed0 + i) for i in range(n)]
    res = Generator(r, speculation=speculation).generate([prompt] * n, sp, max_new_tokens=3)
    return [tuple(x.token_ids[:3]) for x in res]


def test_sampling_end_to_end_joint_distribution_matches_plain():
    """Tokens 2 and 3 come out of ONE tree step with speculation (token 1 from the prefill): their joint
    distribution (given token 1) must match plain sampling's; a negative control at another temperature must
    be detected by the same test."""
    cfg = tiny_config("llama")
    r = ModelRunner(cfg, init_params(cfg, seed=3), num_pages=1200, page_size=4, max_seq_len=64)
    prompt = [5, 6, 7, 8]
    # Branches over the likely tokens (duplicates and shared prefixes included): plain decoding's top-4.
    probe = Generator(r).generate([prompt], max_new_tokens=3)[0].token_ids
    cand = [probe[1], probe[2], (probe[1] + 1) % 97, 11]
    proposer = lambda ctx: [[cand[0], cand[1]], [cand[2]], [cand[0], cand[3]], [cand[3], cand[0]], [cand[2]]]  # noqa: E731
    spec = Speculation(proposer, 8)
    n, batches = 256, 24
    plain, specd, control = [], [], []
    for b in range(batches):
        plain += _first_tokens(r, prompt, None, n, 10_000 * b)
        specd += _first_tokens(r, prompt, spec, n, 10_000 * b + 5_000)
    first = max(set(t[0] for t in plain), key=[t[0] for t in plain].count)  # condition on the commonest token 1

    def table(a, b):
        cells = sorted(set(t[1:] for t in a + b if t[0] == first))
        ca = [sum(1 for t in a if t[0] == first and t[1:] == c) for c in cells]
        cb = [sum(1 for t in b if t[0] == first and t[1:] == c) for c in cells]
        keep = [i for i in range(len(cells)) if ca[i] + cb[i] >= 10]
        return np.array([[ca[i] for i in keep], [cb[i] for i in keep]])

    p = chi2_contingency(table(plain, specd)).pvalue
    assert p > 1e-3, p
    # Negative control: plain sampling at temperature 2.0 differs and the same test sees it.
    for b in range(batches // 2):
        sp = [SamplingParams(temperature=2.0, top_k=4, seed=77_000 + 1000 * b + i) for i in range(n)]
        control += [tuple(x.token_ids[:3]) for x in Generator(r).generate([prompt] * n, sp, max_new_tokens=3)]
    assert chi2_contingency(table(plain, control)).pvalue < 1e-3
    assert r.allocator.num_free == r.allocator.num_usable


def test_pallas_tree_kernel_speculates_like_the_reference(model):
    """The same speculative generation through the Pallas tree kernel (interpret mode on CPU)."""
    ref = runner(model)
    pallas = runner(model, attention_impl="pallas")
    prompts = PROMPTS[:2]
    plain = Generator(ref).generate(prompts, max_new_tokens=10)
    spec = Speculation(oracle_proposers(prompts, [x.token_ids for x in plain]), 8)
    got = Generator(pallas, speculation=spec).generate(prompts, max_new_tokens=10)
    assert [x.token_ids for x in got] == [x.token_ids for x in plain]
    np.testing.assert_allclose([x.logprobs for x in got], [x.logprobs for x in plain], atol=1e-4)
    assert pallas.allocator.num_free == pallas.allocator.num_usable
