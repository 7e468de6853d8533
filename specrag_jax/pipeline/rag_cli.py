"""The RAG flags that ``specrag ask`` and ``specrag eval`` share: parsing them into a ``RAGConfig`` (one-line errors
before any model loads) and building the ``SpecRAG`` they describe."""

from __future__ import annotations

import argparse

from specrag_jax.errors import SpecRagError
from specrag_jax.progress import Progress, stage


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``-q/--quiet``: no stage progress on stderr."""
    p.add_argument("-q", "--quiet", action="store_true", help="no stage progress on stderr")


def add_rag_options(p: argparse.ArgumentParser) -> None:
    """Models, retrieval, drafting, selection, cascade, lossless, rerank and mesh flags of ask and eval."""
    from specrag_jax.pipeline.clustering import SUBSET_MODES
    from specrag_jax.pipeline.factory import DEFAULT_DRAFTER, DEFAULT_VERIFIER
    from specrag_jax.pipeline.rag_config import (
        ANSWER_STOPS,
        DEFAULT_ANSWER_TOKENS,
        DEFAULT_CLUSTERING,
        DEFAULT_CONSENSUS,
        DEFAULT_SELECTION,
        DEFAULT_TAU_MIN,
    )
    from specrag_jax.pipeline.shared_vocab import SHARED_VOCAB_MODES

    p.add_argument("--drafter", default=DEFAULT_DRAFTER)
    p.add_argument(
        "--drafter-adapter",
        default=None,
        metavar="DIR",
        help="a `specrag train --out` folder, a `specrag export-adapter` folder, a shipped adapter's "
        "name, or 'none': merged into the drafter at load (default: the drafter's shipped tuned "
        "adapter, smollm2-rag-drafter for smollm2-135m-instruct)",
    )
    p.add_argument("--verifier", default=DEFAULT_VERIFIER)
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=2048,
        help="context of both models in tokens (up to the model's own limit; pages follow it)",
    )
    p.add_argument("--n-docs", type=int, default=10, help="documents retrieved (or read from the passages)")
    p.add_argument("--m", type=int, default=5, help="number of drafts")
    p.add_argument("--k", type=int, default=2, help="number of clusters (one document per cluster per draft)")
    p.add_argument(
        "--max-answer-tokens",
        type=int,
        default=DEFAULT_ANSWER_TOKENS,
        help=f"the answer's token budget (default {DEFAULT_ANSWER_TOKENS}; eval: the paper's 32)",
    )
    p.add_argument(
        "--answer-stop",
        default="turn",
        choices=ANSWER_STOPS,
        help="turn: the whole reply, up to the verifier's end of turn; line: its first line (the paper's short "
        "answers, eval's default)",
    )
    p.add_argument(
        "--shared-vocab",
        default="auto",
        choices=SHARED_VOCAB_MODES,
        help="drafts as the drafter's token ids when it shares the verifier's vocabulary (auto), always (require: "
        "an error when it does not) or never (off: re-tokenise the drafts' text)",
    )
    p.add_argument("--normalize", default="mean", choices=["sum", "mean"], help="score: raw or per-token mean")
    p.add_argument("--terms", default="draft,sc,sr", help="rho's score terms (ablations), e.g. draft,sc")
    p.add_argument(
        "--selection",
        default=DEFAULT_SELECTION,
        help="how the verifier picks a draft: rho (question + draft only, the paper's), evidence (each "
        "draft with its own passages); +agg: agreeing answers pool their scores; +ground (last): only drafts whose "
        "answer occurs in their own passages are picked or accepted (e.g. evidence+agg+ground)",
    )
    p.add_argument(
        "--tau-min",
        default=DEFAULT_TAU_MIN,
        help="the cascade's confidence floor in [0, 1]: below it the answer comes from --fallback "
        "(0 or 'none': always accept the selected draft)",
    )
    p.add_argument("--fallback", default="standard", choices=["standard", "unanswerable"])
    p.add_argument(
        "--clustering",
        default=DEFAULT_CLUSTERING,
        help="how retrieved passages are grouped before drafting: drafter (the drafter's question-"
        "conditioned embeddings, a forward pass) or lexical (hashed TF-IDF of their words, no model pass)",
    )
    p.add_argument(
        "--subsets",
        default="sample",
        choices=SUBSET_MODES,
        help="how drafts get their passages: sample (one passage per cluster per draft, the paper's) or cover (the "
        "drafts' passages together hold every retrieved passage, each draft mixing the clusters)",
    )
    p.add_argument(
        "--consensus",
        dest="consensus",
        action="store_true",
        default=DEFAULT_CONSENSUS,
        help="accept unanimous drafts without verification (the consensus fast path; off by default: "
        "chosen on the train split)",
    )
    p.add_argument("--no-consensus", dest="consensus", action="store_false", help="always verify (the default)")
    p.add_argument(
        "--no-early-fallback",
        dest="early_fallback",
        action="store_false",
        help="verify the drafts even when none can reach --tau-min (same answers, slower: to measure the "
        "verification a falling-back question skips by default)",
    )
    p.add_argument(
        "--verifier-prompt",
        default="auto",
        choices=["auto", "chat", "plain"],
        help="verifier prompts through its chat template (auto: when it is instruction-tuned)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proposer", default="both", help="lossless method's proposals: ngram, drafts or both")
    p.add_argument(
        "--spec-budget",
        type=int,
        default=None,
        help="lossless method's (and fallback's) largest token tree per verifier step: 8, 16, 32 or 64 "
        "(default: 8 on CPU, 16 on a GPU or TPU)",
    )
    p.add_argument(
        "--router-max-loss",
        type=float,
        default=0.0,
        help="method auto: the largest expected accuracy loss against standard RAG (in [0, 1]) at which the "
        "router may still take the cascade when it is faster (default 0: never an expected loss)",
    )
    p.add_argument(
        "--router-margin",
        type=float,
        default=0.0,
        help="method auto: how much faster than the exact path (a fraction in [0, 1)) the cascade must be expected "
        "to be before the router takes it",
    )
    from specrag_jax.rerank.options import add_rerank_arguments

    add_rerank_arguments(p)
    add_quiet(p)
    from specrag_jax.parallel.cli import add_mesh_arguments

    add_mesh_arguments(p)


def build_rag(args: argparse.Namespace, corpus, config):
    """build_specrag with the drafter/verifier placements from --mesh / --drafter-devices / --verifier-devices."""
    from specrag_jax.parallel.cli import placements_from_args
    from specrag_jax.pipeline.factory import build_specrag

    placements = placements_from_args(args)
    progress: Progress = args.progress
    with stage(progress, "loading") as detail:
        rag = build_specrag(
            args.drafter,
            args.verifier,
            corpus,
            config,
            kv_dir=args.kv_store,
            drafter_adapter=args.drafter_adapter,
            max_seq_len=args.max_seq_len,
            drafter_placement=placements.drafter,
            verifier_placement=placements.verifier,
        )
        drafter = (
            "loads on first use" if getattr(rag.drafter, "loaded", True) is False else f"{rag.drafter.load_s:.1f} s"
        )
        detail.append(
            f"drafter {args.drafter} {drafter}, verifier "
            f"{args.verifier} {getattr(rag.verifier, 'load_s', 0.0):.1f} s, BM25 index over "
            f"{args.corpus or 'the built-in corpus'}; in all"
        )
    return rag


def parse_tau(value: str | float | None) -> float | None:
    """--tau-min: a float in [0, 1] (checked by RAGConfig), or 0 / 'none' for no fallback."""
    if value is None or str(value).lower() == "none":
        return None
    try:
        tau = float(value)
    except ValueError:
        raise SpecRagError(f"--tau-min must be a number in [0, 1] or 'none' (got {value!r})") from None
    return tau or None


def rag_config_from_args(args: argparse.Namespace):
    """The checked ``RAGConfig`` the flags describe (a one-line ``SpecRagError`` on bad input)."""
    from specrag_jax.pipeline.selection import ScoreOptions
    from specrag_jax.pipeline.specrag import RAGConfig
    from specrag_jax.rerank.options import rerank_fields

    scores = ScoreOptions(normalize=args.normalize, terms=tuple(t for t in args.terms.split(",") if t))
    if args.max_seq_len < 64:
        raise SpecRagError(f"--max-seq-len must be >= 64 tokens (got {args.max_seq_len})")
    cfg = RAGConfig(
        n_docs=args.n_docs,
        m=args.m,
        k=args.k,
        max_answer_tokens=args.max_answer_tokens,
        answer_stop=args.answer_stop,
        shared_vocab=args.shared_vocab,
        scores=scores,
        selection=args.selection,
        tau_min=parse_tau(args.tau_min),
        fallback=args.fallback,
        consensus=args.consensus,
        early_fallback=args.early_fallback,
        clustering=args.clustering,
        subsets=args.subsets,
        seed=args.seed,
        verifier_prompt=args.verifier_prompt,
        proposer=args.proposer,
        router_max_loss=args.router_max_loss,
        router_margin=args.router_margin,
        **rerank_fields(args),
        **({} if args.spec_budget is None else {"tree_budget": args.spec_budget}),  # None: the platform's default
    )
    cfg.check()
    started = cfg.progressive_prefill or getattr(args, "concurrency", 1) > 1  # answers on started engines
    if started and cfg.rerank == "recompute":  # refused before loading models, as answer_rows would
        from specrag_jax.pipeline.concurrent_answers import engine_rerank_error
        from specrag_jax.pipeline.factory import reranker_role

        role = reranker_role(cfg, args.drafter, args.verifier)
        if role is not None:
            raise SpecRagError(engine_rerank_error(cfg.rerank, role))
    return cfg
