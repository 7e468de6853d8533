"""The command-line side of ``specrag eval``'s results: each file's ``config`` object, and the suite run
(``--suite DIR`` / repeated ``--data``) that prints and writes Table 1 (``table.json``, ``table.md``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from specrag_jax.errors import SpecRagError
from specrag_jax.evaluation.datasets import Dataset
from specrag_jax.evaluation.suite import SETTINGS, file_settings, load_suite, run_suite, suite_paths
from specrag_jax.evaluation.suite_table import build_table, hardware, table_markdown
from specrag_jax.pipeline.rag_config import RAGConfig
from specrag_jax.pipeline.specrag import SpecRAG
from specrag_jax.rerank.options import rerank_json
from specrag_jax.run_facts import run_facts


def eval_suite(
    args: argparse.Namespace,
    stop: int | None,
    build: Callable[[], SpecRAG],
    pick: Callable[[list[dict], Path], list[dict]],
) -> int:
    """``eval --suite DIR`` / repeated ``--data``: read every file (``stop`` rows at most, ``pick``: split, offset and
    limit), ``build`` the pipeline from ``args`` (its n_docs, m, k set from the first file), run each file with its
    task's settings, then print and write Table 1."""
    if args.corpus is not None:
        raise SpecRagError("--corpus reads one data file's questions; run a suite without it")
    files = load_suite(suite_paths(args.suite, args.data), args.format, args.task, pick, stop)
    given = {name: getattr(args, name) for name in SETTINGS}
    for name, value in file_settings(files[0].data.task, given).items():  # checked now; each file sets its own
        setattr(args, name, value)
    methods = [m for m in args.methods.split(",") if m]
    rag = build()
    out = Path(args.out) if args.out else None
    per_file = run_suite(
        rag,
        files,
        methods,
        given,
        lambda f: eval_config(args, str(f.path), f.data, rag, rag.config),
        out,
        progress=not (args.json or args.quiet),
        concurrency=args.concurrency,
    )
    models = {"drafter": args.drafter, "drafter_adapter": rag.drafter_adapter, "verifier": args.verifier}
    table = build_table(per_file, files, methods, models, hardware())
    table["command"] = "specrag " + " ".join(sys.argv[1:])
    if out is not None:
        (out / "table.json").write_text(json.dumps(table, indent=2))
        (out / "table.md").write_text(table_markdown(table))
    print(json.dumps(table) if args.json else table_markdown(table).rstrip())
    return 0


def eval_config(args: argparse.Namespace, path: str, data: Dataset, rag: SpecRAG, config: RAGConfig) -> dict:
    """The ``config`` object of an eval's results (one data file)."""
    return {
        "data": path,
        "format": data.format,
        "task": data.task,
        "split": args.split,
        "holdout_fraction": args.holdout_fraction,
        "offset": args.offset,
        "limit": args.limit,
        "concurrency": args.concurrency,
        "drafter": args.drafter,
        "drafter_adapter": rag.drafter_adapter,
        "max_seq_len": args.max_seq_len,
        "verifier": args.verifier,
        "n_docs": config.n_docs,
        "m": config.m,
        "k": config.k,
        "max_answer_tokens": config.max_answer_tokens,
        "answer_stop": config.answer_stop,
        "normalize": config.scores.normalize,
        "terms": list(config.scores.terms),
        "selection": config.selection,
        "sr": config.scores.sr,
        "tau_min": config.tau_min,
        "fallback": config.fallback,
        "consensus": config.consensus,
        "early_fallback": config.early_fallback,
        "clustering": config.clustering,
        "seed": config.seed,
        "verifier_prompt": config.verifier_prompt,
        "verifier_chat": rag.verifier_chat,
        "proposer": config.proposer,
        "tree_budget": config.tree_budget,
        **rerank_json(config),
        "corpus": args.corpus,
        "command": "specrag " + " ".join(sys.argv[1:]),
        "run": run_facts(),  # machine, commit and time
    }
