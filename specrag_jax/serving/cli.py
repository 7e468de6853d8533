"""``specrag serve``: load the models, start the engines and serve HTTP with uvicorn."""

from __future__ import annotations

import argparse
import signal
import sys

from specrag_jax.adapters import default_adapter
from specrag_jax.errors import SpecRagError
from specrag_jax.rerank.kv_store import DocKVStore


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``serve`` (its handler is ``args.serve_main``)."""
    from specrag_jax.pipeline.factory import DEFAULT_DRAFTER, DEFAULT_VERIFIER
    from specrag_jax.pipeline.rag_config import DEFAULT_CLUSTERING, DEFAULT_SELECTION, DEFAULT_TAU_MIN

    p = sub.add_parser("serve", help="serve the models over HTTP (OpenAI-compatible + /v1/rag)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--drafter", default=DEFAULT_DRAFTER, help="model name, path, or tiny:llama / tiny:gemma3")
    p.add_argument(
        "--drafter-adapter",
        default=None,
        metavar="DIR",
        help="a `specrag train --out` or `specrag export-adapter` folder, a shipped adapter's name, or "
        "'none': merged into the drafter at load (default: the drafter's shipped tuned adapter)",
    )
    p.add_argument("--verifier", default=DEFAULT_VERIFIER)
    p.add_argument("--corpus", default=None, help="corpus searched when /v1/rag gets no documents")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--num-pages", type=int, default=1024, help="KV pages per model")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--token-budget", type=int, default=256, help="most tokens in one engine step")
    p.add_argument("--max-running", type=int, default=64, help="sequences running per engine")
    p.add_argument("--max-inflight", type=int, default=32, help="HTTP requests served at once")
    p.add_argument("--max-waiting", type=int, default=64, help="more requests than this waiting: 429")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--no-prefix-cache", action="store_true")
    p.add_argument("--no-backpressure", action="store_true")
    p.add_argument(
        "--speculative",
        default="none",
        metavar="PROPOSER",
        help="completions and chat completions decode with token-tree speculation: none (default) or "
        "ngram (prompt lookup); the output is the model's own (greedy: identical)",
    )
    p.add_argument(
        "--spec-budget",
        type=int,
        default=None,
        help="largest token tree per step: 8, 16, 32 or 64 (default: 8 on CPU, 16 on a GPU or TPU)",
    )
    p.add_argument("--n-docs", type=int, default=10)
    p.add_argument("--m", type=int, default=5, help="default number of drafts")
    p.add_argument("--k", type=int, default=2, help="default number of clusters")
    p.add_argument(
        "--selection",
        default=DEFAULT_SELECTION,
        help="/v1/rag's default selection: rho or evidence, optionally +agg then +ground (e.g. evidence+ground)",
    )
    p.add_argument(
        "--tau-min",
        type=float,
        default=DEFAULT_TAU_MIN,
        help="/v1/rag's cascade floor in [0, 1] (0: always accept the selected draft)",
    )
    p.add_argument(
        "--clustering",
        default=DEFAULT_CLUSTERING,
        help="how /v1/rag groups retrieved passages before drafting: drafter (embeddings) or lexical (TF-IDF)",
    )
    p.add_argument(
        "--warmup",
        default="decode",
        choices=["none", "decode", "full"],
        help="compile step shapes before serving: decode steps only, or every reachable shape",
    )
    p.add_argument(
        "--warmup-sampling",
        action="store_true",
        help="also warm up the sampling programs (requests with temperature > 0; greedy is the default)",
    )
    p.add_argument(
        "--compile-cache",
        default=None,
        help="persistent XLA compilation cache directory (default ~/.cache/specrag_jax/xla, shared with "
        "ask/eval/generate; 'none' = off)",
    )
    p.add_argument("--log-level", default="warning")
    from specrag_jax.rerank.options import add_rerank_arguments

    add_rerank_arguments(p)  # /v1/rag's defaults; with --rerank none the server loads no reranker
    from specrag_jax.parallel.cli import add_mesh_arguments

    add_mesh_arguments(p)
    p.set_defaults(serve_main=serve_main)


def _load(name: str, args: argparse.Namespace, seed: int, placement=None, adapter=None):
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.serving.tiny import tiny_text_model

    if name.startswith("tiny:"):
        if adapter is not None:
            raise SpecRagError(f"--drafter-adapter needs a real model, not {name}")
        return tiny_text_model(
            name, seed=seed, num_pages=args.num_pages, page_size=args.page_size, max_seq_len=min(args.max_seq_len, 1024)
        )
    transform = None
    if adapter is not None:
        from specrag_jax.training.lora_merge import adapter_transform  # optax / orbax only when an adapter is used

        transform = adapter_transform(name, adapter)
    return TextModel.load(
        name,
        dtype=args.dtype,
        max_seq_len=args.max_seq_len,
        num_pages=args.num_pages,
        page_size=args.page_size,
        placement=placement,
        transform_params=transform,
    )


def build_service(args: argparse.Namespace):
    """Models, engines and the RAG resources for ``args`` (not started)."""
    from specrag_jax.models.engine.policy import SchedulerConfig
    from specrag_jax.pipeline.clustering import subset_sampler
    from specrag_jax.pipeline.factory import lexical_search
    from specrag_jax.pipeline.specrag import RAGConfig
    from specrag_jax.rerank.options import rerank_fields
    from specrag_jax.retrieval import LexicalIndex, default_corpus, load_corpus
    from specrag_jax.serving.service import ServeConfig, Service

    for flag in (
        "port",
        "num_pages",
        "page_size",
        "token_budget",
        "max_running",
        "max_inflight",
        "max_waiting",
        "max_body_bytes",
    ):
        if getattr(args, flag) < (0 if flag == "port" else 1):
            raise SpecRagError(f"--{flag.replace('_', '-')} must be >= 1 (got {getattr(args, flag)})")
    if args.request_timeout <= 0:
        raise SpecRagError(f"--request-timeout must be > 0 (got {args.request_timeout})")
    rag = RAGConfig(
        n_docs=args.n_docs,
        m=args.m,
        k=args.k,
        selection=args.selection,
        tau_min=args.tau_min,
        clustering=args.clustering,
        **rerank_fields(args),
    )
    rag.check()
    config = ServeConfig(
        request_timeout=args.request_timeout,
        max_inflight=args.max_inflight,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        api_key=args.api_key,
        prefix_cache=not args.no_prefix_cache,
        scheduler=SchedulerConfig(
            token_budget=args.token_budget,
            max_running=args.max_running,
            max_queue=max(args.max_inflight * 4, 16),
            backpressure=not args.no_backpressure,
        ),
        rag=rag,
        speculative=args.speculative,
        **({} if args.spec_budget is None else {"spec_budget": args.spec_budget}),  # None: the platform's default
    )
    from specrag_jax.parallel.cli import placements_from_args

    placements = placements_from_args(args)  # --mesh / --drafter-devices / --verifier-devices
    adapter = default_adapter(args.drafter, args.drafter_adapter)  # the drafter's shipped adapter unless 'none'
    drafter = _load(args.drafter, args, seed=1, placement=placements.drafter, adapter=adapter)
    verifier = (
        drafter if args.verifier == args.drafter else _load(args.verifier, args, seed=2, placement=placements.verifier)
    )
    docs = default_corpus() if args.corpus is None else load_corpus(args.corpus)
    return Service(
        drafter,
        verifier,
        subsets=subset_sampler(rag.clustering, drafter, rag.subsets),
        search=lexical_search(LexicalIndex.build(docs)),
        config=config,
        reranker=_reranker_factory(args, rag, placements.drafter),
        reranker_store=_served_reranker_store(args, rag, {args.drafter: drafter, args.verifier: verifier}),
    )


def _served_reranker_store(args: argparse.Namespace, rag, served: dict) -> DocKVStore | None:
    """The document K/V store the engine-served kv reranker reads (``--kv-store``), when the reranker is a
    served model; None otherwise."""
    name = {"drafter": args.drafter, "verifier": args.verifier}.get(rag.reranker or "drafter", rag.reranker)
    if rag.rerank != "kv" or name not in served:
        return None
    return DocKVStore(args.kv_store, served[name])


def _reranker_factory(args: argparse.Namespace, rag, placement):
    """None with ``--rerank none``; else mode -> Reranker on its own copy of the reranker model (an engine's
    model is stepped by that engine's thread, so a direct reranker never shares it). A drafter or verifier
    reranker serves kv mode on its engine (``Service.reranker``), so its copy is loaded only when a request
    asks for recompute mode; another model is loaded at start."""
    if rag.rerank == "none":
        return None
    import dataclasses
    import threading

    from specrag_jax.pipeline.factory import build_reranker

    name = {"drafter": args.drafter, "verifier": args.verifier}.get(rag.reranker or "drafter", rag.reranker)
    loaded, lock = [], threading.Lock()

    def model():
        with lock:
            if not loaded:
                loaded.append(
                    _load(
                        name,
                        args,
                        seed={args.verifier: 2, args.drafter: 1}.get(name, 3),
                        placement=placement,
                        adapter=default_adapter(args.drafter, args.drafter_adapter) if name == args.drafter else None,
                    )
                )
            return loaded[0]

    if name not in (args.drafter, args.verifier):
        model()
    return lambda mode: build_reranker(dataclasses.replace(rag, rerank=mode), model(), args.kv_store)


def serve_main(args: argparse.Namespace) -> int:
    import uvicorn

    from specrag_jax.models.engine.warmup import default_compile_cache, enable_compile_cache
    from specrag_jax.serving.app import create_app

    if args.compile_cache != "none":
        enable_compile_cache(args.compile_cache or default_compile_cache())
    service = build_service(args)
    if args.warmup != "none":
        print(f"specrag: compiling the engines' step shapes (--warmup {args.warmup}) ...", file=sys.stderr, flush=True)
        for name, report in service.warmup(args.warmup, sampled=args.warmup_sampling).items():
            print(
                f"specrag: {name}: {report['programs']} programs in {report['seconds']} s", file=sys.stderr, flush=True
            )
    app = create_app(service)
    print(
        f"specrag: serving {args.drafter} (drafter) and {args.verifier} (verifier) on http://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn drains in-flight requests on SIGTERM/SIGINT, runs the app's shutdown (engines drain), then re-raises
    # the signal with the handlers it found installed: make those no-ops so a drained shutdown exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=60)
    print("specrag: server stopped (in-flight requests drained)", file=sys.stderr, flush=True)
    return 0
