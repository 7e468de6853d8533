"""Lossless mode: token-tree speculation vs plain decoding on dev RAG answers, one run, same machine.

For each dev question (its own passages, the pipeline's truncation, the drafter's m drafts): the verifier's
standard-RAG answer, greedy, decoded plainly and with each proposer (ngram, drafts, both). Reported:
- exactness: every speculative answer vs the plain one, token for token; a difference is checked for a
  numerical near-tie (top-2 logit gap at the first differing position < 1e-4) and listed;
- accepted tokens per verifier step (mean and histogram) and decode-phase tokens/s per proposer vs plain;
- whole-answer latency of ``lossless`` (drafting + speculative answer; ngram needs no drafts) vs ``standard``;
- a copy-heavy workload (the answer quotes the evidence, up to 128 new tokens);
- the cost of one tree step of each budget vs one decode step at the workload's context length.
Runs that compiled (new shapes) are left out of the timing means and counted.

    python benchmarks/speculative.py --data ../shared/data/retrievalqa_dev.jsonl --limit 50 \
        --out benchmarks/results/speculative_qwen.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import loadavg, run_header, write_results
from specrag_jax.compile_time import CompileClock
from specrag_jax.evaluation.run import load_questions
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import SpeculationStats, combine_stats
from specrag_jax.models.speculative.tree import build_tree, stack_trees
from specrag_jax.pipeline.factory import DEFAULT_DRAFTER, DEFAULT_VERIFIER, build_specrag
from specrag_jax.pipeline.lossless import lossless_speculation
from specrag_jax.pipeline.specrag import RAGConfig
from specrag_jax.pipeline.verifier_prompts import answer_prompt
from specrag_jax.retrieval import docs_from_context
from specrag_jax.xla_cache import enable_xla_cache

NEAR_TIE = 1e-4


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_once(model, ids, speculation, max_new: int, stop) -> dict:
    """One greedy answer: tokens, timings (compile time inside them), speculation counts."""
    with CompileClock() as clock:
        t = time.perf_counter()
        [res] = model.generate_ids([ids], SamplingParams(), max_new, stop=stop, speculation=speculation)
        total = time.perf_counter() - t
    return {
        "tokens": res.token_ids,
        "text": res.text,
        "prefill_s": res.prefill_s,
        "decode_s": res.decode_s,
        "total_s": total,
        "compile_s": clock.seconds,
        "stats": res.speculation or SpeculationStats(),
    }


def top2_gap(model, ids: list[int]) -> float:
    """The verifier's top-2 logit gap for the token after ``ids`` (fresh prefill)."""
    r = model.runner
    pages = r.allocator.allocate(-(-len(ids) // r.page_size))
    try:
        logits = r.logits(r.pack([Chunk(pages, 0, ids, rows=[len(ids) - 1])]))[0]
    finally:
        r.allocator.release(pages)
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def compare(model, ids, plain: list[int], spec: list[int]) -> dict | None:
    """None when equal; else the first differing position and its near-tie gap."""
    if plain == spec:
        return None
    k = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
    gap = top2_gap(model, ids + plain[:k])
    return {"position": k, "top2_gap": gap, "near_tie": gap < NEAR_TIE}


def step_costs(model, ids: list[int], budgets, repeats: int) -> dict:
    """Seconds of one decode step and of one tree step per budget after ``len(ids)`` cached tokens."""
    r = model.runner
    n = len(ids)
    pages = r.allocator.allocate(-(-(n + max(budgets) + 1) // r.page_size))
    try:
        r.score(r.pack([Chunk(pages, 0, ids, rows=[n - 1])]), [0])

        def best(fn):
            fn()  # compile
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return min(times)

        decode = best(
            lambda: r.sample(r.pack([Chunk(pages, n, [ids[-1]], rows=[0])], token_bucket=1), SamplingBatch.greedy(1))
        )
        out = {"context_tokens": n, "decode_step_s": decode, "tree_step_s": {}}
        rng = np.random.default_rng(0)
        for b in budgets:
            props = [rng.integers(0, r.cfg.vocab_size, (b - 1) // 4).tolist() for _ in range(4)]
            tree = build_tree(props, ids[-1], b)
            chunk = Chunk(pages, n, tree.tokens, parents=tree.parents, positions=tree.positions(n))
            t = best(lambda: r.speculate(r.pack([chunk], token_bucket=b), stack_trees([tree]), SamplingBatch.greedy(1)))
            out["tree_step_s"][str(b)] = t
            out.setdefault("tree_vs_decode", {})[str(b)] = round(t / decode, 3)
        return out
    finally:
        r.allocator.release(pages)


def speculation(tok, drafts, variant: str, default_budget: int):
    """The Speculation of a variant "PROPOSER" or "PROPOSER@BUDGET"."""
    name, _, budget = variant.partition("@")
    return lossless_speculation(tok, drafts, name, int(budget) if budget else default_budget)


def timed(x: dict) -> bool:
    return x["compile_s"] < 0.05


def paired_speedup(plain: list[dict], spec: list[dict]) -> dict:
    """Decode-phase tokens/s of both on the questions where neither run compiled, and their ratio."""
    pairs = [(a, b) for a, b in zip(plain, spec) if timed(a) and timed(b)]

    def rate(runs):
        return sum(max(len(x["tokens"]) - 1, 0) for x in runs) / max(sum(x["decode_s"] for x in runs), 1e-9)

    a, b = rate([x for x, _ in pairs]), rate([y for _, y in pairs])
    return {
        "paired_questions": len(pairs),
        "plain_decode_tokens_per_s": round(a, 3),
        "decode_tokens_per_s": round(b, 3),
        "decode_speedup_vs_plain": round(b / a, 3) if a else None,
        "answer_speedup_vs_plain": round(
            sum(x["total_s"] for x, _ in pairs) / max(sum(y["total_s"] for _, y in pairs), 1e-9), 3
        ),
    }


def summarize_runs(runs: list[dict]) -> dict:
    timed_runs = [x for x in runs if timed(x)]
    decode_tokens = sum(max(len(x["tokens"]) - 1, 0) for x in timed_runs)
    decode_s = sum(x["decode_s"] for x in timed_runs)
    return {
        "runs": len(runs),
        "timed_runs": len(timed_runs),
        "decode_tokens": decode_tokens,
        "decode_tokens_per_s": round(decode_tokens / decode_s, 3) if decode_s else None,
        "answer_s_mean": statistics.fmean(x["total_s"] for x in timed_runs) if timed_runs else None,
        "speculation": combine_stats([x["stats"] for x in runs]),
    }


def question_prompt(rag, row: dict, question: str | None = None) -> tuple[list[int], list, float]:
    """(verifier prompt ids of the standard answer, the drafts, drafting seconds) for one dev row;
    ``question`` replaces the row's question in the verifier prompt (the copy workload)."""
    docs = rag._documents(row["question"], docs_from_context(row.get("context") or []), [])
    t = time.perf_counter()
    drafts = rag._draft(row["question"], docs, {"notes": []})
    draft_s = time.perf_counter() - t
    tok = rag.verifier.tokenizer
    ids = tok.encode_rendered(answer_prompt(tok, question or row["question"], docs, rag.verifier_chat))
    return ids, drafts, draft_s


def answers_workload(args, rag, rows, proposers, full) -> tuple[dict, list[int]]:
    """The dev RAG answers (greedy, max_answer_tokens, stop at a newline): exactness, speed, latency."""
    model, tok, max_new = rag.verifier, rag.verifier.tokenizer, rag.config.max_answer_tokens
    runs = {p: [] for p in ["plain"] + proposers}
    lossless_s = {p: [] for p in proposers}
    standard_s, mismatches, drafting_s = [], [], []
    first_ids = None
    for q, row in enumerate(rows):
        ids, drafts, draft_s = question_prompt(rag, row)
        first_ids = first_ids or ids
        plain = run_once(model, ids, None, max_new, ["\n"])
        chosen = [p for p in proposers if p in full or args.subset_limit is None or q <= args.subset_limit]
        results = {p: run_once(model, ids, speculation(tok, drafts, p, args.budget), max_new, ["\n"]) for p in chosen}
        if q == 0:
            continue
        runs["plain"].append(plain)
        drafting_s.append(draft_s)
        standard_s.append(plain["total_s"])
        for p, res in results.items():
            runs[p].append(res)
            lossless_s[p].append(res["total_s"] + (draft_s if not p.startswith("ngram") else 0.0))
            diff = compare(model, ids, plain["tokens"], res["tokens"])
            if diff:
                mismatches.append({"question_id": row.get("question_id"), "proposer": p, **diff})
        _log(
            f"q{q}: plain {len(plain['tokens'])} tok {plain['decode_s']:.2f}s | "
            + " | ".join(f"{p} {r['stats'].steps} steps {r['decode_s']:.2f}s" for p, r in results.items())
            + f" | mismatches so far {len(mismatches)}"
        )
    answers = {p: summarize_runs(v) for p, v in runs.items()}
    for p in proposers:  # against plain decoding of the same questions
        answers[p]["paired"] = paired_speedup(runs["plain"], runs[p])
    return {
        "questions": len(runs["plain"]),
        "exactness": {
            "compared": sum(len(runs[p]) for p in proposers),
            "mismatches": len(mismatches),
            "near_ties": sum(m["near_tie"] for m in mismatches),
            "not_near_ties": sum(not m["near_tie"] for m in mismatches),
            "details": mismatches,
        },
        "answers": answers,
        "latency_s": {
            "standard_mean": statistics.fmean(standard_s),
            "drafting_mean": statistics.fmean(drafting_s),
            "standard_same_questions_mean": {
                p: statistics.fmean(standard_s[: len(v)]) for p, v in lossless_s.items() if v
            },
            **{f"lossless_{p}_mean": statistics.fmean(v) for p, v in lossless_s.items() if v},
        },
    }, first_ids


COPY_PROMPT = (
    "Repeat all of the evidence passages above exactly, word for word, one after another, with their "
    "numbers and titles. (They were retrieved for: {question})"
)


def copy_workload(args, rag, rows, proposers) -> dict:
    """Answers that quote the evidence: up to ``--copy-tokens`` new tokens, no stop string (EOS ends them)."""
    model, tok = rag.verifier, rag.verifier.tokenizer
    copy = {p: [] for p in ["plain"] + proposers}
    mismatches = []
    for row in rows:
        ids, drafts, _ = question_prompt(rag, row, COPY_PROMPT.format(question=row["question"]))
        plain = run_once(model, ids, None, args.copy_tokens, [])
        copy["plain"].append(plain)
        for p in proposers:
            res = run_once(model, ids, speculation(tok, drafts, p, args.budget), args.copy_tokens, [])
            copy[p].append(res)
            diff = compare(model, ids, plain["tokens"], res["tokens"])
            if diff:
                mismatches.append({"question_id": row.get("question_id"), "proposer": p, **diff})
        _log(
            f"copy: plain {len(plain['tokens'])} tok {plain['decode_s']:.2f}s, "
            + ", ".join(f"{p} {copy[p][-1]['decode_s']:.2f}s" for p in proposers)
        )
    summary = {p: summarize_runs(v) for p, v in copy.items()}
    for p in proposers:
        summary[p]["paired"] = paired_speedup(copy["plain"], copy[p])
    return {**summary, "questions": len(rows), "prompt": COPY_PROMPT, "mismatches": mismatches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="../shared/data/retrievalqa_dev.jsonl")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--verifier", default=DEFAULT_VERIFIER)
    ap.add_argument(
        "--proposers",
        default="ngram,drafts,both",
        help="variants, PROPOSER or PROPOSER@BUDGET (default budget: --budget)",
    )
    ap.add_argument("--full", default="both", help="variants run on every question (the rest: --subset-limit)")
    ap.add_argument(
        "--subset-limit",
        type=int,
        default=None,
        help="run the other variants on the first N questions only (each run prefills again)",
    )
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--copy-limit", type=int, default=8, help="questions of the copy-heavy workload")
    ap.add_argument("--copy-tokens", type=int, default=128)
    ap.add_argument("--step-repeats", type=int, default=5)
    ap.add_argument("--workloads", default="answers,copy,steps", help="which parts to run (comma-separated)")
    ap.add_argument("--out", default="benchmarks/results/speculative_qwen.json")
    args = ap.parse_args()
    enable_xla_cache()
    proposers = [p for p in args.proposers.split(",") if p]
    full = set(x for x in args.full.split(",") if x)
    rag = build_specrag(args.drafter, args.verifier, None, RAGConfig())
    model = rag.verifier
    rows = load_questions(args.data, args.limit + 1)  # the first one warms up (compiles), not reported
    workloads = set(args.workloads.split(","))
    payload = {**run_header(), "verifier": args.verifier, "drafter": args.drafter, "budget": args.budget}
    first_ids = None
    if "answers" in workloads:
        payload["answers_workload"], first_ids = answers_workload(args, rag, rows, proposers, full)
    if "copy" in workloads:
        payload["copy_heavy"] = copy_workload(args, rag, rows[1 : 1 + args.copy_limit], proposers)
    if "steps" in workloads:
        first_ids = first_ids or question_prompt(rag, rows[0])[0]
        payload["step_costs"] = step_costs(model, first_ids, (8, 16, 32, 64), args.step_repeats)
    payload["loadavg_end"] = loadavg()
    path = write_results(args.out, payload)
    _log(f"wrote {path}")


if __name__ == "__main__":
    main()
