"""Where speculative RAG pays: accuracy and latency per stage vs the number of retrieved passages (issue 21).

Every question retrieves from one pooled corpus (every dev passage, ``retrieval.pooling``) its top 5, 10, 20 and
40 passages (about 0.5k to 4.5k prompt tokens for standard RAG) with both models' context raised to
``--max-seq-len``. For each size, one run of standard RAG, the speculative cascade and the router (method ``auto``,
the default: its paths, predicted and measured times, and the path it would take on an H200 and a TPU v5e with the
same prompts, ``router.route_on``) on the same questions and models; plain speculative (the selected draft, never
falling back) is read from the same run: its answer is the cascade's selected draft and its latency the cascade's
stages before any fallback.
Each size first answers ``--warmup`` questions (discarded) so compilation stays out of the stage times, and
records every stage against its bound (``roofline``). ``--also-clustering lexical`` answers the same questions with
speculative RAG under another clustering in the same run (``clustering_alternatives`` of each size; standard is
shared); ``--also-selection rho`` likewise with another selection and no fallback (``tau_min`` None: the paper's
plain speculative RAG, ``selection_alternatives``); ``--also-subsets cover`` with drafts whose passages together
hold every retrieved one (``subsets_alternatives``, at ``--also-subsets-at`` sizes). Writes
``benchmarks/results/long_context.json`` and a plot
of latency vs standard RAG's prompt tokens.

    python benchmarks/long_context.py --data ../shared/data/retrievalqa_dev.jsonl --split heldout --limit 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results
from specrag_jax.evaluation.holdout import split_rows
from specrag_jax.evaluation.run import SCORED_AFTER, evaluate, is_correct, load_questions
from specrag_jax.machine_peaks import DEVICE_PEAKS, device_peaks
from specrag_jax.pipeline.clustering import CLUSTERINGS, subset_sampler
from specrag_jax.pipeline.factory import build_specrag
from specrag_jax.pipeline.rag_config import DEFAULT_CLUSTERING
from specrag_jax.pipeline.roofline import model_cost
from specrag_jax.pipeline.router import ROUTE_PATHS, route_on
from specrag_jax.pipeline.selection import SELECTIONS
from specrag_jax.pipeline.specrag import RAGConfig
from specrag_jax.retrieval.pooling import pool_passages
from specrag_jax.xla_cache import enable_xla_cache

BEFORE_FALLBACK = ("retrieval_s", "clustering_s", "drafting_s", "verification_s", "evidence_verification_s")


def plain_speculative(predictions: list[dict], rows: list[dict], selection: str) -> dict:
    """The selected draft without the fallback: accuracy and latency (the cascade's stages before it). A question
    the cascade sent to the fallback without verifying (``confidence_bound``) takes the selection's pick on the
    drafts eval scored afterwards, and that pass's seconds."""
    truth = {r.get("question_id"): r["ground_truth"] for r in rows}
    needed = "evidence_verification_s" if selection.startswith("evidence") else "verification_s"
    spec = [p for p in predictions if p["method"] == "speculative"]
    correct, latency = [], []
    for p in spec:
        index = p.get("chosen_draft")
        if index is None and p.get("path") == "fallback":
            index = p["selections"][selection]["draft"]
        chosen = next((d for d in p["drafts"] if d["index"] == index), None)
        answer = chosen["answer"] if chosen else p["answer"]  # consensus: the cascade's own answer is the draft
        correct.append(is_correct(answer, truth[p["question_id"]]))
        seconds = sum(p["stages_s"].get(k, 0.0) for k in BEFORE_FALLBACK) - p["compile_s"]
        if needed not in p["stages_s"] and p.get("path") == "fallback":
            seconds += p.get(SCORED_AFTER, {}).get(needed, 0.0)
        latency.append(seconds)
    return {"accuracy": sum(correct) / len(spec), "latency_s": statistics.fmean(latency)}


def speculative_part(res: dict, rows: list[dict], standard_s: float, selection: str) -> dict:
    """One run's speculative RAG: the cascade, plain speculative, selection options and both ratios to standard."""
    spec = res["methods"]["speculative"]
    plain = plain_speculative(res["predictions"], rows, selection)
    return {
        "speculative": {
            "accuracy": spec["accuracy"],
            "latency_s": spec["latency_s"]["mean"],
            "stages_s": spec["stages_s"],
            "cascade": spec["cascade"],
            "tokens_per_question": spec["tokens"]["per_question"],
        },
        "plain_speculative": plain,
        "selection": res["selection"],
        "ratio_cascade_vs_standard": spec["latency_s"]["mean"] / standard_s,
        "ratio_plain_vs_standard": plain["latency_s"] / standard_s,
    }


METHODS = ["standard", "speculative", "auto"]
PLATFORM_OF = {"h200": "gpu", "tpu-v5e": "tpu"}


def auto_part(res: dict, standard_s: float, rag) -> dict:
    """The router's run at one size, and the paths it would take on each accelerator of ``DEVICE_PEAKS``."""
    auto = res["methods"]["auto"]
    routes = [p["route"] for p in res["predictions"] if p["method"] == "auto"]
    costs = (model_cost(rag.drafter), model_cost(rag.verifier))
    platforms = {}
    for name in DEVICE_PEAKS:
        found = [route_on(r, *costs, device_peaks(name), PLATFORM_OF[name]) for r in routes]
        platforms[name] = {
            "paths": {p: sum(f.path == p for f in found) for p in ROUTE_PATHS},
            "predicted_exact_ms": 1e3 * statistics.fmean(f.predicted_s["exact"] for f in found),
            "predicted_cascade_ms": 1e3 * statistics.fmean(f.predicted_s["cascade"] for f in found),
            "break_even_accept": statistics.fmean(f.break_even_accept for f in found),
        }
    return {
        "accuracy": auto["accuracy"],
        "latency_s": auto["latency_s"]["mean"],
        "stages_s": auto["stages_s"],
        "router": auto["router"],
        "ratio_vs_standard": auto["latency_s"]["mean"] / standard_s,
        "router_on_devices": platforms,
    }


def plot(sizes: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["standard_prompt_tokens"] for s in sizes]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, key in (
        ("standard RAG", "standard"),
        ("speculative (cascade)", "speculative"),
        ("plain speculative", "plain_speculative"),
        ("auto (the router, default)", "auto"),
    ):
        if all(key in s for s in sizes):
            ax.plot(x, [s[key]["latency_s"] for s in sizes], marker="o", label=name)
    for alt in sizes[0].get("clustering_alternatives", {}):
        for name, key in (("cascade", "speculative"), ("plain", "plain_speculative")):
            y = [s["clustering_alternatives"][alt][key]["latency_s"] for s in sizes]
            ax.plot(x, y, marker="x", linestyle="--", label=f"{name}, {alt} clustering")
    for alt in sizes[0].get("selection_alternatives", {}):
        y = [s["selection_alternatives"][alt]["plain_speculative"]["latency_s"] for s in sizes]
        ax.plot(x, y, marker="s", linestyle=":", label=f"plain, {alt} selection")
    for s in sizes:
        ax.annotate(
            f"{s['n_docs']} passages",
            (s["standard_prompt_tokens"], s["standard"]["latency_s"]),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=8,
        )
    ax.set_xlabel("standard RAG prompt tokens")
    ax.set_ylabel("mean latency per question (s)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--sizes", default="5,10,20,40")
    ap.add_argument("--max-seq-len", type=int, default=8192)
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="questions answered (and discarded) before each size: their compilation stays out",
    )
    ap.add_argument("--clustering", default=DEFAULT_CLUSTERING, choices=CLUSTERINGS)
    ap.add_argument("--also-clustering", default="", help="comma-separated clusterings also measured (speculative)")
    ap.add_argument("--also-selection", default="", help="comma-separated selections also measured, no fallback")
    ap.add_argument(
        "--also-subsets",
        default="",
        help="comma-separated subset modes also measured (speculative; e.g. cover: the drafts hold every passage)",
    )
    ap.add_argument("--also-subsets-at", default="20,40", help="the sizes at which --also-subsets runs")
    ap.add_argument("--out", default="benchmarks/results/long_context.json")
    args = ap.parse_args()
    others = [c for c in args.also_clustering.split(",") if c]
    if any(c not in CLUSTERINGS or c == args.clustering for c in others):
        ap.error(f"--also-clustering takes other clusterings among {CLUSTERINGS}")
    selections = [c for c in args.also_selection.split(",") if c]
    if any(c not in SELECTIONS for c in selections):
        ap.error(f"--also-selection takes selections among {SELECTIONS}")
    enable_xla_cache()
    all_rows = load_questions(args.data)
    corpus = pool_passages(all_rows)
    rows = split_rows(all_rows, args.split, 0.3)[: args.limit]
    rag = build_specrag(corpus=corpus, config=RAGConfig(clustering=args.clustering), max_seq_len=args.max_seq_len)
    samplers = {c: subset_sampler(c, rag.drafter) for c in [args.clustering, *others]}
    modes = [c for c in args.also_subsets.split(",") if c]
    mode_samplers = {mode: subset_sampler(args.clustering, rag.drafter, mode) for mode in modes}
    mode_sizes = {int(v) for v in args.also_subsets_at.split(",") if v}
    sizes = []
    for n in [int(s) for s in args.sizes.split(",")]:
        rag.config.n_docs = n
        rag.subsets_fn, rag.config.clustering = samplers[args.clustering], args.clustering
        if args.warmup:
            evaluate(rag, rows[: args.warmup], METHODS, progress=False, corpus=corpus)
        res = evaluate(rag, rows, METHODS, progress=False, corpus=corpus)
        std = res["methods"]["standard"]
        entry = {
            "n_docs": n,
            "standard_prompt_tokens": std["tokens"]["verifier_prefill_tokens"] / len(rows),
            "standard": {
                "accuracy": std["accuracy"],
                "latency_s": std["latency_s"]["mean"],
                "stages_s": std["stages_s"],
            },
            **speculative_part(res, rows, std["latency_s"]["mean"], rag.config.selection),
            "auto": auto_part(res, std["latency_s"]["mean"], rag),
            "recall_own_passages": std.get("recall_own_passages"),
            "roofline": {m: res["methods"][m]["roofline"] for m in METHODS},
            "roofline_peaks": res["roofline_peaks"],
        }
        entry["clustering_alternatives"] = {}
        for name in others:
            rag.subsets_fn, rag.config.clustering = samplers[name], name
            if args.warmup:
                evaluate(rag, rows[: args.warmup], ["speculative"], progress=False, corpus=corpus)
            alt = evaluate(rag, rows, ["speculative"], progress=False, corpus=corpus)
            part = speculative_part(alt, rows, entry["standard"]["latency_s"], rag.config.selection)
            entry["clustering_alternatives"][name] = {**part, "roofline": alt["methods"]["speculative"]["roofline"]}
        entry["subsets_alternatives"] = {}
        for mode in modes if n in mode_sizes else []:
            rag.subsets_fn, rag.config.clustering = mode_samplers[mode], args.clustering
            if args.warmup:
                evaluate(rag, rows[: args.warmup], ["speculative"], progress=False, corpus=corpus)
            alt = evaluate(rag, rows, ["speculative"], progress=False, corpus=corpus)
            part = speculative_part(alt, rows, entry["standard"]["latency_s"], rag.config.selection)
            entry["subsets_alternatives"][mode] = {**part, "roofline": alt["methods"]["speculative"]["roofline"]}
        rag.subsets_fn, rag.config.clustering = samplers[args.clustering], args.clustering
        entry["selection_alternatives"] = {}
        default_selection, default_tau = rag.config.selection, rag.config.tau_min
        for name in selections:
            rag.config.selection, rag.config.tau_min = name, None
            if args.warmup:
                evaluate(rag, rows[: args.warmup], ["speculative"], progress=False, corpus=corpus)
            alt = evaluate(rag, rows, ["speculative"], progress=False, corpus=corpus)
            part = speculative_part(alt, rows, entry["standard"]["latency_s"], rag.config.selection)
            entry["selection_alternatives"][name] = {**part, "roofline": alt["methods"]["speculative"]["roofline"]}
        rag.config.selection, rag.config.tau_min = default_selection, default_tau
        sizes.append(entry)
        write(args, rows, rag, corpus, sizes)  # after every size: a cut-short run keeps what it measured
        line = f"{n:3d} passages, {entry['standard_prompt_tokens']:.0f} tokens: standard {std['accuracy']:.2f} "
        line += f"{entry['standard']['latency_s']:.1f}s"
        auto = entry["auto"]
        line += f" | auto {auto['accuracy']:.2f} {auto['latency_s']:.1f}s ({auto['ratio_vs_standard']:.2f}x, "
        line += f"paths {auto['router']['paths']})"
        alternatives = [*entry["clustering_alternatives"].items()]
        alternatives += [(f"selection {k}", v) for k, v in entry["selection_alternatives"].items()]
        alternatives += [(f"subsets {k}", v) for k, v in entry["subsets_alternatives"].items()]
        for name, part in [(args.clustering, entry), *alternatives]:
            spec, plain = part["speculative"], part["plain_speculative"]
            line += (
                f" | {name}: cascade {spec['accuracy']:.2f} {spec['latency_s']:.1f}s "
                f"({part['ratio_cascade_vs_standard']:.2f}x), plain {plain['accuracy']:.2f} "
                f"{plain['latency_s']:.1f}s ({part['ratio_plain_vs_standard']:.2f}x)"
            )
        print(line, flush=True)


def write(args: argparse.Namespace, rows: list[dict], rag, corpus: list[dict], sizes: list[dict]) -> None:
    """The results so far (JSON) and the plot."""
    crossover = next((s["n_docs"] for s in sizes if s["ratio_cascade_vs_standard"] < 1.0), None)
    auto_over = [s["auto"]["ratio_vs_standard"] for s in sizes]
    out = write_results(
        args.out,
        {
            **run_header(),
            "questions": [r.get("question_id") for r in rows],
            "one_question_points": 100.0 / len(rows),
            "max_seq_len": args.max_seq_len,
            "selection": rag.config.selection,
            "clustering": args.clustering,
            "tau_min": rag.config.tau_min,
            "drafter_adapter": rag.drafter_adapter,
            "corpus_passages": len(corpus),
            "sizes": sizes,
            "cascade_crossover_n_docs": crossover,
            "auto_ratio_vs_standard_max": max(auto_over) if auto_over else None,
        },
    )
    plot(sizes, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
