"""Verification and decode attention costs on the real models (reference attention path, this CPU).

(a) Scoring m=5 branches of 64 tokens after a 512-token prefix:
    - one packed tree pass over [prefix | branch_1 .. branch_5] (every branch attends to the prefix and its
      own earlier tokens; positions restart after the prefix),
    - the prefix written to pages once, then one packed tree pass over the 5 branches (what the pipeline's
      verification does),
    - 5 separate passes over prefix + branch (each draft scored as its own request),
    - 5 passes over the branch that reuse a cached prefix (prefix prefilled once into pages).
    Each pass computes the branch tokens' log-probabilities, as verification does. The forward pass alone
    (no log-probabilities) is reported too.
(b) Fraction of KV blocks the Pallas tree kernel skips for that tree (from its block plan).
(c) Paged (16-token pages, scattered) vs contiguous (one page) decode step at a 1024-token context.

Usage: python benchmarks/kernels.py [--models gemma3-270m,smollm2-135m-instruct] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR, loadavg, run_header, write_results
from specrag_jax.kernels import chain_parents
from specrag_jax.machine_peaks import best_time
from specrag_jax.models.executor.packing import Chunk, pack_chunks
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.text_model import TextModel

PREFIX, BRANCH, M = 512, 64, 5


def fit(n: int) -> int:
    """Token bucket for the benchmark: the next multiple of 64, so no variant pays for power-of-2 padding."""
    return -(-n // 64) * 64


def tree_chunk(prefix: list[int], branches: list[list[int]]) -> tuple[Chunk, list[int]]:
    """One chunk holding the prefix chain and m branches hanging off its last token; rows + targets."""
    tokens, parents, positions = list(prefix), list(chain_parents(len(prefix))), list(range(len(prefix)))
    rows, targets = [], []
    for br in branches:
        start = len(tokens)
        for i, tok in enumerate(br):
            parent = len(prefix) - 1 if i == 0 else start + i - 1
            tokens.append(tok)
            parents.append(parent)
            positions.append(len(prefix) + i)
            rows.append(parent)
            targets.append(tok)
    return Chunk([], 0, tokens, parents=parents, positions=positions, write=False, rows=rows), targets


def timed(fn, repeats: int) -> float:
    """Best of ``repeats`` timed calls after one untimed call (compile + warm)."""
    fn()
    return best_time(fn, repeats)


def verification(r: ModelRunner, repeats: int, rng: np.random.Generator) -> dict:
    vocab = r.cfg.vocab_size
    prefix = [int(t) for t in rng.integers(10, vocab, PREFIX)]
    branches = [[int(t) for t in rng.integers(10, vocab, BRANCH)] for _ in range(M)]
    tree, targets = tree_chunk(prefix, branches)

    def packed(score: bool = True):
        t = fit(len(tree.tokens))
        if score:
            return r.score(r.pack([tree], token_bucket=t), targets)
        return r.logits(r.pack([Chunk([], 0, tree.tokens, tree.parents, tree.positions, False, [0])], token_bucket=t))

    def separate(score: bool = True):
        out = []
        for br in branches:
            seq = prefix + br
            rows = list(range(PREFIX - 1, PREFIX + BRANCH - 1)) if score else [0]
            step = r.pack([Chunk([], 0, seq, write=False, rows=rows)], token_bucket=fit(len(seq)))
            out.append(r.score(step, br) if score else r.logits(step))
        return out

    def cached():
        pages = r.allocator.allocate(-(-PREFIX // r.page_size))
        try:
            first = r.score(
                r.pack([Chunk(pages, 0, prefix, rows=[PREFIX - 1])], token_bucket=fit(PREFIX)), [branches[0][0]]
            )
            out = [first]
            for br in branches:
                step = r.pack(
                    [Chunk(pages, PREFIX, br, write=False, rows=list(range(BRANCH - 1)))], token_bucket=fit(BRANCH)
                )
                out.append(r.score(step, br[1:]))
            return out
        finally:
            r.allocator.release(pages)

    def prefix_then_tree():
        """What the pipeline does: the prefix into pages once, then all branches as one tree chunk."""
        pages = r.allocator.allocate(-(-PREFIX // r.page_size))
        try:
            first = r.score(
                r.pack([Chunk(pages, 0, prefix, rows=[PREFIX - 1])], token_bucket=fit(PREFIX)), [branches[0][0]]
            )
            toks, parents, positions, rows, tgts = [], [], [], [], []
            for br in branches:
                start = len(toks)
                for i, tok in enumerate(br):
                    toks.append(tok)
                    parents.append(-1 if i == 0 else start + i - 1)
                    positions.append(PREFIX + i)
                    if i:
                        rows.append(start + i - 1)
                        tgts.append(tok)
            chunk = Chunk(pages, PREFIX, toks, parents=parents, positions=positions, write=False, rows=rows)
            return [first, r.score(r.pack([chunk], token_bucket=fit(len(toks))), tgts)]
        finally:
            r.allocator.release(pages)

    # Same numbers from the packed pass and the separate passes (a correctness guard on the benchmark).
    diff = float(np.abs(packed() - np.concatenate(separate())).max())
    res = {
        "packed_tree_s": timed(packed, repeats),
        "separate_passes_s": timed(separate, repeats),
        "cached_prefix_passes_s": timed(cached, repeats),
        "prefix_then_one_tree_pass_s": timed(prefix_then_tree, repeats),
        "forward_only_packed_s": timed(lambda: packed(False), repeats),
        "forward_only_separate_s": timed(lambda: separate(False), repeats),
        "max_abs_logprob_diff_packed_vs_separate": diff,
    }
    res["speedup_vs_separate"] = res["separate_passes_s"] / res["packed_tree_s"]
    res["speedup_vs_cached_prefix"] = res["cached_prefix_passes_s"] / res["packed_tree_s"]
    res["prefix_then_tree_speedup_vs_separate"] = res["separate_passes_s"] / res["prefix_then_one_tree_pass_s"]
    res["prefix_then_tree_speedup_vs_cached_prefix"] = (
        res["cached_prefix_passes_s"] / res["prefix_then_one_tree_pass_s"]
    )
    res["forward_only_speedup_vs_separate"] = res["forward_only_separate_s"] / res["forward_only_packed_s"]
    return res


def skipped_fraction() -> dict:
    """Block-skip statistics of the Pallas tree kernel's plan for the benchmark tree (if available)."""
    try:
        from specrag_jax.kernels.pallas_tree import tree_skip_fraction
    except ImportError as exc:  # the kernel module is optional for this benchmark
        return {"error": f"pallas tree kernel unavailable: {exc}"}
    tree, _ = tree_chunk(list(range(PREFIX)), [list(range(BRANCH))] * M)
    step = pack_chunks([tree], page_size=16, num_slots=1024, token_bucket=fit(len(tree.tokens)))
    return {backend: tree_skip_fraction(step.meta, 16, backend=backend) for backend in ("tpu", "gpu")}


def decode_paged_vs_contiguous(model: TextModel, repeats: int) -> dict:
    cfg, params = model.runner.cfg, model.runner.params
    out = {}
    for label, page_size, num_pages in (("paged_16", 16, 130), ("contiguous", 1024, 3)):
        r = ModelRunner(cfg, params, num_pages=num_pages, page_size=page_size, max_seq_len=1024)
        held = r.allocator.allocate(r.allocator.num_free)  # scatter: take every other page
        r.allocator.release(held[1::2] if page_size == 16 else held)
        pages = r.allocator.allocate(-(-1024 // page_size))
        step = r.pack([Chunk(pages, 1000, [5], rows=[0])], token_bucket=1)
        out[f"{label}_step_ms"] = 1e3 * timed(lambda: r.sample(step, SamplingBatch.greedy(1)), repeats * 5)
    out["paged_over_contiguous"] = out["paged_16_step_ms"] / out["contiguous_step_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma3-270m,smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS_DIR / "kernels.json"))
    args = ap.parse_args()
    results = {**run_header(), "loadavg_start": loadavg(), "attention_impl": "reference", "models": {}}
    results["block_skipping"] = skipped_fraction()
    for name in args.models.split(","):
        model = TextModel.load(name, max_seq_len=1024, max_batch=1)
        rng = np.random.default_rng(0)
        entry = {"verification": verification(model.runner, args.repeats, rng)}
        entry["decode"] = decode_paged_vs_contiguous(model, args.repeats)
        results["models"][name] = entry
        v = entry["verification"]
        print(
            f"{name}: packed {v['packed_tree_s']:.2f}s, separate {v['separate_passes_s']:.2f}s "
            f"({v['speedup_vs_separate']:.2f}x), cached-prefix {v['cached_prefix_passes_s']:.2f}s "
            f"({v['speedup_vs_cached_prefix']:.2f}x); "
            f"prefix pages + one tree pass {v['prefix_then_one_tree_pass_s']:.2f}s "
            f"({v['prefix_then_tree_speedup_vs_separate']:.2f}x vs separate); "
            f"forward only {v['forward_only_speedup_vs_separate']:.2f}x; "
            f"decode paged/contiguous {entry['decode']['paged_over_contiguous']:.2f}"
        )
    results["loadavg_end"] = loadavg()
    results["target"] = "packed tree >= 3x vs separate passes (reference path, CPU)"
    print("wrote", write_results(args.out, results))


if __name__ == "__main__":
    main()
