"""Command-line flags of reranking (ask, eval, serve): ``--rerank``, ``--reranker``, ``--n-coarse``,
``--rerank-group``, ``--rerank-patience``, ``--progressive-prefill``; values are checked by ``RAGConfig.check``
(one-line errors)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from specrag_jax.errors import SpecRagError


def add_rerank_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the rerank flags (defaults: RAGConfig's) to ``parser``."""
    g = parser.add_argument_group("reranking (coarse to fine)")
    g.add_argument(
        "--rerank",
        default="none",
        metavar="MODE",
        help="rerank the coarse candidates: none (default), kv (the reranker reads stored document "
        "K/V) or recompute (it recomputes each document)",
    )
    g.add_argument(
        "--reranker",
        default=None,
        metavar="MODEL",
        help="the reranker's model: a model name, 'drafter' or 'verifier' (default: the drafter)",
    )
    g.add_argument(
        "--n-coarse",
        type=int,
        default=50,
        help="coarse (BM25) candidates reranked when a question comes without passages",
    )
    g.add_argument("--rerank-group", type=int, default=10, help="candidates the fine reranker scores per group")
    g.add_argument(
        "--rerank-patience",
        default="2",
        metavar="P",
        help="stop reranking once the top n-docs set is unchanged for P groups ('inf': never early)",
    )
    g.add_argument(
        "--progressive-prefill",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="N",
        help="prefill the drafter's prompts (and the standard prompt) once the top n-docs set is unchanged "
        "for N groups (default N 1) while reranking goes on (ask and eval then run on started engines with a "
        "prefix cache, as serve does)",
    )
    g.add_argument(
        "--kv-store",
        default=None,
        metavar="DIR",
        help="the document K/V store of --rerank kv (default: <cache root>/doc_kv; `specrag index "
        "--store DIR` fills it)",
    )


def parse_patience(text: str | int | float) -> float:
    """``--rerank-patience``: a whole number >= 1, or 'inf'."""
    if isinstance(text, (int, float)):
        return text
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        return int(text)
    except ValueError:
        raise SpecRagError(f"--rerank-patience must be a whole number >= 1 or 'inf' (got {text!r})") from None


def rerank_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The RAGConfig fields of the parsed rerank flags."""
    return {
        "rerank": args.rerank,
        "reranker": args.reranker,
        "n_coarse": args.n_coarse,
        "rerank_group": args.rerank_group,
        "rerank_patience": parse_patience(args.rerank_patience),
        "progressive_prefill": args.progressive_prefill,
    }


def rerank_json(config: Any) -> dict[str, Any]:
    """The rerank fields of a RAGConfig as the eval JSON ``config`` records them (patience 'inf' as a string)."""
    patience = config.rerank_patience
    return {
        "rerank": config.rerank,
        "reranker": config.reranker,
        "n_coarse": config.n_coarse,
        "rerank_group": config.rerank_group,
        "rerank_patience": "inf" if math.isinf(patience) else patience,
        "progressive_prefill": config.progressive_prefill,
    }
