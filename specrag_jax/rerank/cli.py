"""``specrag index --corpus C --kv-for MODEL``: store each document's reranker prefix K/V."""

from __future__ import annotations

import argparse
import json
import sys

from specrag_jax.errors import SpecRagError
from specrag_jax.rerank.prompts import PROMPT_FORMS


def add_index_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``index`` (its handler is ``args.index_main``)."""
    p = sub.add_parser("index", help="compute and store every document's reranker K/V (for --rerank kv)")
    p.add_argument("--corpus", required=True, help="JSON-lines file or folder of .txt/.md files")
    p.add_argument(
        "--kv-for",
        required=True,
        metavar="MODEL",
        help="the reranker model: a known name, a .gguf file or an HF directory",
    )
    p.add_argument("--store", default=None, help="store directory (default: <cache root>/doc_kv)")
    p.add_argument("--max-doc-tokens", type=int, default=160, help="document tokens kept (the rest is cut)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--prompt-form",
        default="auto",
        choices=PROMPT_FORMS,
        help="judging prompt: plain text, the chat template, or auto (chat for instruction-tuned)",
    )
    p.add_argument("--token-budget", type=int, default=2048, help="most document tokens in one prefill step")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(index_main=index_main)


def index_main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specrag_jax.models.text_model import TextModel
    from specrag_jax.progress import NO_PROGRESS, stage
    from specrag_jax.rerank.index import build_index
    from specrag_jax.rerank.kv_store import DocKVStore
    from specrag_jax.retrieval.corpus import load_corpus

    if args.max_doc_tokens < 1 or args.token_budget < 1 or args.page_size < 1:
        raise SpecRagError("--max-doc-tokens, --token-budget and --page-size must be >= 1")
    progress = getattr(args, "progress", NO_PROGRESS)
    docs = load_corpus(args.corpus)
    longest = max(args.token_budget, args.max_doc_tokens + 512)  # one prefill step (+ prompt and chat template)
    num_pages = -(-longest // args.page_size) + 9  # + a partial page for each of a batch's 8 documents
    with stage(progress, f"loading {args.kv_for}"):
        model = TextModel.load(
            args.kv_for,
            dtype=args.dtype,
            num_pages=num_pages,
            page_size=args.page_size,
            max_seq_len=max(2048, args.max_doc_tokens + 512),
        )
    store = DocKVStore(args.store, model)
    bar = tqdm(total=len(docs), unit="doc", desc="indexing", disable=args.quiet, file=sys.stderr)
    done = [0]  # a disabled tqdm does not count

    def step(n: int, _total: int) -> None:
        bar.update(n - done[0])
        done[0] = n

    try:
        summary = build_index(
            model,
            docs,
            store,
            max_doc_tokens=args.max_doc_tokens,
            token_budget=args.token_budget,
            prompt_form=args.prompt_form,
            progress=step,
            corpus_name=str(args.corpus),
            batch_docs=8,
        )
    except KeyboardInterrupt:
        bar.close()
        print(
            f"specrag: index interrupted ({done[0]} of {len(docs)} documents done); run it again to resume",
            file=sys.stderr,
        )
        return 130
    bar.close()
    summary["store"] = str(store.directory)
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['documents']} documents: {summary['computed']} computed, {summary['skipped']} already "
            f"stored; {summary['tokens']} prefix tokens, {summary['bytes'] / 1e6:.1f} MB "
            f"({summary['bytes_per_token']:.0f} bytes per token) in {store.directory}"
        )
    return 0
