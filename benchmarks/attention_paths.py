"""Per-layer attention cost of the CPU paths against the reference, on the shapes the pipeline's steps take.

Each case builds one layer's page pool and a step's metadata at a real model's head shape, then times (best
of ``--repeats``, after a compile) the reference (``paged_tree_attention_reference``: the whole page-table
bucket gathered at once) and the path ``paged_attention`` dispatches to on a CPU (``kernels/decode_blocked.py``
for decode steps, ``kernels/blocked.py`` otherwise: cached keys in blocks up to the longest valid prefix).
Both run in this one process, so the ratio is what the change buys here; outputs agree to float32 rounding.
Two cases are trees in one step (a question, then branches off it): clustering's documents and evidence
verification's drafts with their passages, where most of a query block's earlier keys are other branches'.
The bound is the larger of reading the visible cached K/V once at this machine's measured bandwidth and the
score and value matmuls over the visible query-key pairs (4 x q heads x head_dim FLOPs each) at its measured
matmul rate. Prefill cases of several sequences also time the earlier prefix read (every token
against every sequence's key block, ``kernels.blocked.SEGMENTED_PREFIX`` off): ``dispatched_one_hot_prefix_ms``;
decode cases of several rows the earlier schedule (every row reads the longest row's blocks in
lockstep, ``kernels.decode_blocked.PACKED_DECODE`` off): ``dispatched_lockstep_decode_ms``.

Usage: python benchmarks/attention_paths.py [--repeats 5] [--out benchmarks/results/attention_paths.json]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import loadavg, run_header, write_results
from specrag_jax.kernels import (
    AttentionMetadata,
    blocked,
    decode_blocked,
    paged_attention,
    paged_tree_attention_reference,
)
from specrag_jax.machine_peaks import best_time, measure_peaks

HEADS = {"smollm2": (9, 3, 64), "qwen2.5-1.5b": (12, 2, 128)}  # (q heads, kv heads, head_dim)
PAGE = 16
# (name, heads, queries per sequence, cached tokens per sequence, page-table bucket in pages[, live rows])
CASES = [
    ("drafting decode, 8 drafts x 600 cached", "smollm2", 1, [600] * 5 + [0] * 3, 64),
    ("drafting decode, 8 drafts x 1,200 cached", "smollm2", 1, [1200] * 5 + [0] * 3, 128),
    ("drafting decode, 5 rows of which 2 live (sticky width), 400 cached", "smollm2", 1, [400] * 5, 32, 2),
    ("drafting decode, 5 drafts of 150-450 cached", "smollm2", 1, [150, 220, 300, 380, 450], 32),
    ("server decode, 8 sequences of 60-3,000 cached", "qwen2.5-1.5b", 1, [60, 90, 150, 200, 300, 400, 3000, 120], 256),
    ("drafting prefill, 2 sequences x 256 queries, 80 cached", "smollm2", 256, [80, 80], 64),
    ("drafting prefill, 5 branches x 100 queries after a 48-token prefix", "smollm2", 100, [48] * 5, 32),
    ("standard prefill, 512 queries, 512 cached (4k prompt's 2nd chunk)", "qwen2.5-1.5b", 512, [512], 256),
    ("standard prefill, 512 queries, 3,584 cached (4k prompt's last chunk)", "qwen2.5-1.5b", 512, [3584], 256),
    ("standard decode, 1 sequence x 4,000 cached", "qwen2.5-1.5b", 1, [4000], 256),
]
# (name, heads, cached prefix, question tokens, branch lengths, page-table bucket): one sequence, a tree step
TREE_CASES = [
    ("clustering: question + 40 documents x 96 tokens, one tree", "smollm2", 0, 16, [96] * 40, 256),
    ("evidence verification: 5 drafts x 352 tokens off a 64-token prefix", "qwen2.5-1.5b", 64, 0, [352] * 5, 128),
]


def build_case(heads, per_seq: int, lens: list[int], bucket_pages: int, rng, live: int | None = None):
    """A step of ``per_seq`` tokens for each sequence of ``lens`` cached tokens; rows past ``live`` sequences are
    padding (as a decode width's finished rows are)."""
    hq, hkv, d = heads
    s = len(lens)
    n_pages = 1 + s * bucket_pages
    k_pool = jnp.asarray(rng.standard_normal((n_pages, PAGE, hkv, d)), jnp.float32)
    v_pool = jnp.asarray(rng.standard_normal((n_pages, PAGE, hkv, d)), jnp.float32)
    t = s * per_seq
    q = jnp.asarray(rng.standard_normal((t, hq, d)), jnp.float32)
    k_new = jnp.asarray(rng.standard_normal((t, hkv, d)), jnp.float32)
    v_new = jnp.asarray(rng.standard_normal((t, hkv, d)), jnp.float32)
    tables = (1 + np.arange(s * bucket_pages).reshape(s, bucket_pages)).astype(np.int32)
    token_seq = np.repeat(np.arange(s, dtype=np.int32), per_seq)
    offset = np.tile(np.arange(per_seq, dtype=np.int32), s)
    kv_lens = np.asarray(lens, np.int32)
    positions = kv_lens[token_seq] + offset
    parents = np.where(offset == 0, -1, np.arange(t) - 1).astype(np.int32)
    valid = token_seq < (s if live is None else live)
    meta = AttentionMetadata(
        token_seq, positions, parents, valid, np.full(t, n_pages * PAGE, np.int32), tables, kv_lens
    )
    return (q, k_new, v_new, k_pool, v_pool, meta), per_seq == 1


def build_tree_case(heads, cached: int, question: int, branches: list[int], bucket_pages: int, rng):
    """One sequence: ``cached`` keys in pages, then a step of ``question`` chain tokens and branches off its last
    token (off the prefix when there is no question). Returns the arguments and the visible pairs per token."""
    hq, hkv, d = heads
    parents, depth = list(range(-1, question - 1)), list(range(question))
    for n in branches:
        start = len(parents)
        parents += [question - 1] + list(range(start, start + n - 1))
        depth += list(range(question, question + n))
    t = len(parents)
    n_pages = 1 + bucket_pages
    k_pool = jnp.asarray(rng.standard_normal((n_pages, PAGE, hkv, d)), jnp.float32)
    v_pool = jnp.asarray(rng.standard_normal((n_pages, PAGE, hkv, d)), jnp.float32)
    q = jnp.asarray(rng.standard_normal((t, hq, d)), jnp.float32)
    k_new = jnp.asarray(rng.standard_normal((t, hkv, d)), jnp.float32)
    v_new = jnp.asarray(rng.standard_normal((t, hkv, d)), jnp.float32)
    meta = AttentionMetadata(
        np.zeros(t, np.int32),
        cached + np.asarray(depth, np.int32),
        np.asarray(parents, np.int32),
        np.ones(t, bool),
        np.full(t, n_pages * PAGE, np.int32),
        (1 + np.arange(bucket_pages, dtype=np.int32))[None],
        np.asarray([cached], np.int32),
    )
    return (q, k_new, v_new, k_pool, v_pool, meta), sum(cached + x + 1 for x in depth)


def best_ms(fn, args, repeats: int) -> float:
    """Fastest call of ``fn(*args)`` in milliseconds, after one call that compiles it."""
    jax.block_until_ready(fn(*args))
    return 1e3 * best_time(lambda: jax.block_until_ready(fn(*args)), repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/attention_paths.json")
    args = ap.parse_args()
    peaks = measure_peaks()
    rng = np.random.default_rng(0)
    rows = []
    cases = []
    for name, model, per_seq, lens, bucket_pages, *live in CASES:
        case, decode = build_case(HEADS[model], per_seq, lens, bucket_pages, rng, *live)
        lens = lens[: live[0]] if live else lens
        pairs = sum(n * per_seq + per_seq * (per_seq + 1) // 2 for n in lens)  # cached + causal chunk keys
        cases.append((name, model, case, decode, False, sum(lens), pairs))
    for name, model, cached, question, branches, bucket_pages in TREE_CASES:
        case, pairs = build_tree_case(HEADS[model], cached, question, branches, bucket_pages, rng)
        cases.append((name, model, case, False, True, cached, pairs))
    for name, model, case, decode, tree, cached_keys, pairs in cases:
        reference = jax.jit(functools.partial(paged_tree_attention_reference, scale=0.1, tree=tree))
        dispatched = jax.jit(functools.partial(paged_attention, scale=0.1, tree=tree, decode=decode))
        ref_ms, new_ms = best_ms(reference, case, args.repeats), best_ms(dispatched, case, args.repeats)
        err = float(jnp.abs(reference(*case) - dispatched(*case)).max())
        extra = {}
        if not decode and not tree and case[5].page_table.shape[0] > 1:  # several sequences: the old prefix read too
            blocked.SEGMENTED_PREFIX = False  # read when traced: a new jit traces with it off
            one_hot = jax.jit(functools.partial(paged_attention, scale=0.1, tree=tree, decode=decode))
            extra["dispatched_one_hot_prefix_ms"] = round(best_ms(one_hot, case, args.repeats), 3)
            blocked.SEGMENTED_PREFIX = True
        if decode and case[5].page_table.shape[0] > 1:  # several rows: the lockstep schedule too
            decode_blocked.PACKED_DECODE = False
            lockstep = jax.jit(functools.partial(paged_attention, scale=0.1, tree=tree, decode=decode))
            extra["dispatched_lockstep_decode_ms"] = round(best_ms(lockstep, case, args.repeats), 3)
            decode_blocked.PACKED_DECODE = True
        hq, hkv, d = HEADS[model]
        kv_bytes = 2 * cached_keys * hkv * d * 4
        bound_ms = 1e3 * max(kv_bytes / peaks.bytes_per_s, 4 * hq * d * pairs / peaks.flops_per_s)
        rows.append(
            {
                "case": name,
                "model_heads": model,
                "reference_ms": round(ref_ms, 3),
                "dispatched_ms": round(new_ms, 3),
                "speedup": round(ref_ms / new_ms, 2),
                "bound_ms": round(bound_ms, 3),
                "dispatched_over_bound": round(new_ms / bound_ms, 2),
                "max_abs_diff": err,
                **extra,
            }
        )
        print(
            f"{name}: reference {ref_ms:.2f} ms, dispatched {new_ms:.2f} ms ({ref_ms / new_ms:.1f}x), "
            f"bound {bound_ms:.2f} ms, max diff {err:.1e}",
            flush=True,
        )
    write_results(args.out, {**run_header(), "peaks": peaks.to_dict(), "loadavg_after": loadavg(), "cases": rows})


if __name__ == "__main__":
    main()
