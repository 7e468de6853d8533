"""Statistical losslessness of tree speculative sampling (issue 12, "Must show").

A toy "verifier" gives every token sequence fixed pseudo-random logits (vocabulary <= 16); a toy proposer
gives each context 1-4 continuations of depth <= 3 (the first of depth 3) plus two exact duplicates (merged
by the trie), tokens drawn from a drafter near the target (70%) or at random. Up to three speculative steps
(vmapped over 2**17 keys) produce the first three tokens; plain sampling would draw them from
p(t1) p(t2 | t1) p(t3 | t1, t2). Tested: chi-square on the first token, on the second given the first and
the third given the first two (pooled over conditioning groups), on the joint of the first two; total
variation of each position's marginal < 3 / sqrt(N), and of the 2-token joint < 1.5x what sampling noise
alone gives. Negative controls (duplicate siblings not merged; accepting with r < 1.2 p) must fail.
"""

from __future__ import annotations

import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specrag_jax.models.sampling.filtering import target_probs
from specrag_jax.models.speculative.accept import accept_from_probs, draw_uniforms
from specrag_jax.models.speculative.tree import TokenTree, build_tree, stack_trees

N = 1 << 17
STEPS = 3
P_PASS, P_DETECT = 1e-3, 1e-6


@functools.lru_cache(maxsize=None)
def _logits(seed: int, vocab: int, scale: float, seq: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([seed, vocab, *[t + 1 for t in seq]])
    return (rng.normal(size=vocab) * scale).astype(np.float32)


def _probs(case: dict, seqs: list[tuple[int, ...]]) -> np.ndarray:
    """Plain-sampling distributions after each token sequence [len(seqs), V] (float32)."""
    lg = jnp.asarray(np.stack([_logits(case["seed"], case["vocab"], case["scale"], s) for s in seqs]))
    r = len(seqs)
    return np.asarray(
        target_probs(lg, jnp.full(r, case["temp"]), jnp.full(r, case["top_k"], jnp.int32), jnp.full(r, case["top_p"]))
    )


def _proposals(case: dict, ctx: tuple[int, ...]) -> list[list[int]]:
    rng = np.random.default_rng([case["seed"], 99, *[t + 1 for t in ctx]])
    vocab, props = case["vocab"], []
    for i in range(rng.integers(1, 5)):  # 1-4 continuations (siblings <= 4)
        seq: list[int] = []
        for _ in range(3 if i == 0 else rng.integers(1, 4)):  # depth <= 3, the first one 3
            lg = _logits(case["seed"], vocab, case["scale"], ctx + tuple(seq)).astype(np.float64)
            p = np.exp(lg - lg.max())  # a drafter close to the target (temperature 1, unfiltered)
            seq.append(int(rng.choice(vocab, p=p / p.sum())) if rng.random() < 0.7 else int(rng.integers(vocab)))
        props.append(seq)
    props += [list(props[i]) for i in rng.integers(0, len(props), size=2)]  # exact duplicates
    return props


def _chain_tree(props: list[list[int]], root: int, budget: int) -> TokenTree:
    """Negative control: every proposal its own branch, duplicates NOT merged (duplicate siblings)."""
    tree = build_tree([], root, budget)
    arrays = {
        f: np.array(getattr(tree, f)) for f in ("tokens", "parents", "depth", "valid", "first_child", "next_sibling")
    }
    i, last_root_child = 1, -1
    for prop in props:
        parent = 0
        for t in prop[: budget - i]:
            arrays["tokens"][i], arrays["parents"][i], arrays["valid"][i] = t, parent, True
            arrays["depth"][i] = arrays["depth"][parent] + 1
            if parent == 0:
                if last_root_child < 0:
                    arrays["first_child"][0] = i
                else:
                    arrays["next_sibling"][last_root_child] = i
                last_root_child = i
            else:
                arrays["first_child"][parent] = i
            parent, i = i, i + 1
    return TokenTree(**arrays)


def contexts(vocab: int) -> list[tuple[int, ...]]:
    """Every context a step can start from: (), (t1,), (t1, t2); index 0, 1 + t1, 1 + V + t1 * V + t2."""
    return [()] + [(a,) for a in range(vocab)] + list(itertools.product(range(vocab), repeat=2))


def tables(case: dict, layout: str = "trie") -> tuple[TokenTree, np.ndarray]:
    """Trees [C, B] and the target probabilities at each of their rows [C, B, V] for every context.

    layout: "trie" (build_tree), "chains" (one branch per proposal, duplicates kept) or "distinct_chains"
    (the same without the proposals whose first token an earlier one already has)."""
    trees, probs = [], []
    for ctx in contexts(case["vocab"]):
        props, root = _proposals(case, ctx), 0  # the root token's value does not enter the acceptance
        if layout == "distinct_chains":
            firsts = [p[0] for p in props]
            props = [p for i, p in enumerate(props) if firsts.index(p[0]) == i]
        tree = build_tree(props, root, case["budget"]) if layout == "trie" else _chain_tree(props, root, case["budget"])
        seqs = []
        for c in range(tree.budget):  # token sequence after which row c predicts
            path, u = [], c
            while u > 0:
                path.append(int(tree.tokens[u]))
                u = int(tree.parents[u])
            seqs.append(ctx + tuple(reversed(path)))
        trees.append(tree)
        probs.append(_probs(case, seqs))
    return stack_trees(trees), np.stack(probs)


@functools.partial(jax.jit, static_argnames="vocab")
def simulate(trees: TokenTree, probs: jax.Array, keys: jax.Array, coin_scale: jax.Array, *, vocab: int):
    """First three generated tokens [N, 3] and the first step's accepted count [N]."""

    def one(key):
        out, n, first_n = jnp.full(3, -1, jnp.int32), jnp.int32(0), jnp.int32(0)
        for step, k in enumerate(jax.random.split(key, STEPS)):
            ci = jnp.where(n == 0, 0, jnp.where(n == 1, 1 + out[0], 1 + vocab + out[0] * vocab + out[1]))
            ci = jnp.clip(jnp.where(n >= 3, 0, ci), 0, probs.shape[0] - 1)
            tree = jax.tree_util.tree_map(operator.itemgetter(ci), trees)
            coins, final_key = draw_uniforms(k, probs.shape[1])
            _, acc, toks = accept_from_probs(probs[ci], tree, coins * coin_scale, final_key)
            j = jnp.arange(3)
            take = (j >= n) & (j < n + acc + 1)
            out = jnp.where(take, toks[jnp.clip(j - n, 0, toks.shape[0] - 1)], out)
            first_n = acc if step == 0 else first_n
            n = jnp.minimum(n + acc + 1, 3)
        return out, first_n

    return jax.vmap(one)(keys)


def chi2(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int, int]:
    """(statistic, degrees of freedom, samples outside the support); cells with expected < 5 are pooled."""
    outside = int(observed[expected == 0].sum())
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), int(len(obs) - 1), outside


def _pvalue(parts: list[tuple[float, int, int]]) -> tuple[float, int]:
    stat, df, outside = (sum(p[i] for p in parts) for i in range(3))
    return (float(stats.chi2.sf(stat, df)) if df > 0 else 1.0), outside


def analyse(case: dict, samples: np.ndarray) -> dict:
    v, n = case["vocab"], len(samples)
    t1, t2, t3 = samples.T
    p1 = _probs(case, [()])[0].astype(np.float64)
    p2 = _probs(case, [(a,) for a in range(v)]).astype(np.float64)  # [t1, t2]
    c1 = np.bincount(t1, minlength=v)
    joint = np.bincount(t1 * v + t2, minlength=v * v).reshape(v, v)
    joint_exp = p1[:, None] * p2
    out = {"p_first": _pvalue([chi2(c1, n * p1)])}
    out["p_second_given_first"] = _pvalue([chi2(joint[a], c1[a] * p2[a]) for a in range(v) if c1[a] >= 20])
    out["p_joint_12"] = _pvalue([chi2(joint.ravel(), n * joint_exp.ravel())])
    p3 = _probs(case, list(itertools.product(range(v), repeat=2))).astype(np.float64).reshape(v, v, v)
    c3 = np.bincount((t1 * v + t2) * v + t3, minlength=v**3).reshape(v, v, v)
    out["p_third_given_12"] = _pvalue(
        [chi2(c3[a, b], joint[a, b] * p3[a, b]) for a, b in zip(*np.nonzero(joint >= 20))]
    )
    marginal3 = np.einsum("ab,abc->c", joint_exp, p3)
    for name, obs, exp in (
        ("tv_first", c1, p1),
        ("tv_second", np.bincount(t2, minlength=v), p1 @ p2),
        ("tv_third", np.bincount(t3, minlength=v), marginal3),
        ("tv_joint_12", joint, joint_exp),
    ):
        out[name] = 0.5 * float(np.abs(obs / n - exp).sum())
    # TV that sampling noise alone gives a multinomial of n draws: E|X/n - p| ~ sqrt(2 p (1 - p) / (pi n)).
    out["tv_joint_12_noise"] = 0.5 * float(np.sqrt(2 * joint_exp * (1 - joint_exp) / (np.pi * n)).sum())
    return out


def passes(report: dict) -> bool:
    pvals = [v for k, v in report.items() if k.startswith("p_")]
    tvs = [report[k] for k in ("tv_first", "tv_second", "tv_third")]
    return (
        all(p > P_PASS and outside == 0 for p, outside in pvals)
        and all(t < 3 / np.sqrt(N) for t in tvs)
        and report["tv_joint_12"] < 1.5 * report["tv_joint_12_noise"]
    )


CASES = {
    "plain": dict(seed=1, vocab=16, scale=1.5, temp=1.0, top_k=0, top_p=1.0, budget=8),
    "filtered": dict(seed=2, vocab=12, scale=1.5, temp=0.8, top_k=6, top_p=0.9, budget=16),
    "peaked": dict(seed=3, vocab=8, scale=3.0, temp=1.0, top_k=0, top_p=1.0, budget=8),
}


def run(name: str, layout: str = "trie", coin_scale: float = 1.0) -> tuple[dict, np.ndarray]:
    case = CASES[name]
    trees, probs = tables(case, layout)
    keys = jax.random.split(jax.random.PRNGKey(case["seed"]), N)
    samples, first_n = simulate(trees, jnp.asarray(probs), keys, jnp.float32(coin_scale), vocab=case["vocab"])
    samples = np.asarray(samples)
    assert (samples >= 0).all()
    return analyse(case, samples), np.bincount(np.asarray(first_n), minlength=4)


@pytest.mark.parametrize("name", CASES)
def test_speculative_sampling_is_lossless(name):
    report, accepted_hist = run(name)
    print(f"\n{name}: {report} first-step accepted histogram {accepted_hist.tolist()}")
    assert passes(report), report
    assert accepted_hist[1:].sum() > N // 10 and accepted_hist[3] > 0  # deep paths are exercised


def test_chains_with_distinct_siblings_pass():
    """The chain layout of the negative control is itself sound: without duplicate siblings it passes."""
    report, _ = run("plain", layout="distinct_chains")
    print(f"\ndistinct_chains: {report}")
    assert passes(report), report


@pytest.mark.parametrize("control", ["unmerged_duplicates", "coin_1.2p"])
def test_negative_controls_are_detected(control):
    kw = dict(layout="chains") if control == "unmerged_duplicates" else dict(coin_scale=1 / 1.2)
    report, _ = run("plain", **kw)
    print(f"\n{control}: {report}")
    assert not passes(report)
    assert report["p_first"][0] < P_DETECT and report["tv_first"] > 3 / np.sqrt(N)
