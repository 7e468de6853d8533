"""Drafting with the decode batch on exactly m rows (``seq_count_bucket``) against the power-of-two rows it had.

Five drafts used to decode on eight rows (``bucket(5)``): every padded row pays its share of the step's
attention. Both widths run in one process on the same dev questions (the default pair's drafter with its tuned
adapter, lexical subsets, m=5, k=2), alternating per question after a warm-up pass of each, so neither includes
compilation and both see the same machine state. Greedy drafts must be identical (asserted).

    python benchmarks/decode_width.py --questions 8 --out benchmarks/results/decode_width.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import load_tuned_drafter, run_header, write_results

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "retrievalqa_dev.jsonl"


def main(argv: list[str] | None = None) -> int:
    import specrag_jax.models.engine.policy as policy
    from specrag_jax.evaluation.run import _row_docs, load_questions
    from specrag_jax.models.executor.packing import bucket, seq_count_bucket
    from specrag_jax.pipeline.clustering import lexical_subsets
    from specrag_jax.pipeline.drafting import truncate_docs, write_drafts

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(DEV))
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--m", type=int, default=5)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    drafter = load_tuned_drafter(args.m)
    gen = drafter.generator
    inner = gen.generate_phases
    timing: dict = {}

    def timed_phases(*a, **kw):
        phases = inner(*a, **kw)
        timing["decode_s"] = sum(res[0].decode_s for res in phases)
        timing["steps"] = sum(max(len(r.token_ids) for r in res) for res in phases)
        return phases

    gen.generate_phases = timed_phases
    widths = {"power_of_two": bucket, "exact": seq_count_bucket}
    subsets_fn = lexical_subsets()
    work = []
    for row in load_questions(args.data)[: args.questions]:
        docs = truncate_docs(drafter, _row_docs(row)[:10], 160, [])
        subsets, _ = subsets_fn(row["question"], docs, args.k, args.m, 0)
        work.append((row["question_id"], row["question"], [[docs[i] for i in s] for s in subsets]))

    def draft(width: str, question: str, subsets) -> tuple[list[str], float, float, int]:
        policy.seq_count_bucket = widths[width]  # the offline engine's decode width rule
        t = time.perf_counter()
        drafts, _ = write_drafts(drafter, question, subsets)
        return [d.text for d in drafts], time.perf_counter() - t, timing["decode_s"], timing["steps"]

    try:
        for width in widths:  # warm-up: every program of both widths
            for _, question, subsets in work:
                draft(width, question, subsets)
        per: dict[str, dict[str, list[float]]] = {w: {"drafting_s": [], "step_ms": []} for w in widths}
        for qid, question, subsets in work:
            texts = {}
            for width in widths:
                texts[width], total, decode, steps = draft(width, question, subsets)
                per[width]["drafting_s"].append(total)
                per[width]["step_ms"].append(1000 * decode / max(steps, 1))
            assert texts["exact"] == texts["power_of_two"], f"{qid}: drafts differ between the widths"
    finally:
        policy.seq_count_bucket = seq_count_bucket
    summary = {
        w: {
            "rows": widths[w](args.m),
            "drafting_s_mean": statistics.mean(v["drafting_s"]),
            "decode_step_ms_median": statistics.median(v["step_ms"]),
        }
        for w, v in per.items()
    }
    ratio = summary["exact"]["drafting_s_mean"] / summary["power_of_two"]["drafting_s_mean"]
    step_ratio = summary["exact"]["decode_step_ms_median"] / summary["power_of_two"]["decode_step_ms_median"]
    result = {
        **run_header(),
        "questions": [w[0] for w in work],
        "m": args.m,
        "k": args.k,
        "drafts_identical": True,
        "widths": summary,
        "drafting_ratio_exact_vs_power_of_two": ratio,
        "decode_step_ratio_exact_vs_power_of_two": step_ratio,
        "per_question": per,
    }
    for w, s in summary.items():
        step_ms = s["decode_step_ms_median"]
        print(f"{w:>13}: {s['rows']} rows, drafting {s['drafting_s_mean']:.2f} s, decode step {step_ms:.1f} ms")
    print(f"exact / power of two: drafting {ratio:.3f}x, decode step {step_ratio:.3f}x")
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
