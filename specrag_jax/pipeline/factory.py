"""Assembling a SpecRAG: models, corpus search and the multi-perspective subset sampler."""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from specrag_jax.adapters import default_adapter
from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.deferred_model import DeferredTextModel
from specrag_jax.models.text_model import TextModel
from specrag_jax.models.tokenizer.load import load_tokenizer
from specrag_jax.pipeline.clustering import subset_sampler
from specrag_jax.pipeline.reranking import Scorer
from specrag_jax.pipeline.shared_vocab import require_same_vocabulary
from specrag_jax.pipeline.specrag import RAGConfig, SearchFn, SpecRAG
from specrag_jax.rerank.kv_store import DocKVStore
from specrag_jax.rerank.reranker import Reranker
from specrag_jax.retrieval import LexicalIndex, default_corpus, load_corpus
from specrag_jax.training.lora_merge import adapter_info, adapter_transform

DEFAULT_DRAFTER = "smollm2-135m-instruct"
DEFAULT_VERIFIER = "qwen2.5-coder-1.5b-instruct"


def lexical_search(index: LexicalIndex) -> SearchFn:
    """Top-n documents of a BM25 index (as document dicts with their score)."""

    def search(question: str, n: int) -> list[dict]:
        return [{**index.docs[i], "score": float(s)} for i, s in index.search(question, n)]

    return search


RERANK_CACHE_DOCS = 64  # documents whose K/V a kv-mode Reranker keeps in pages between questions
RERANK_DOC_SLACK = 128  # tokens of judging instruction, chat template and title beside max_doc_tokens


def reranker_pages(config: RAGConfig, page_size: int = 16) -> int:
    """KV pages a Reranker may hold in its model's pool: its cached documents plus one group's (kv mode)."""
    if config.rerank != "kv":
        return 0
    return (RERANK_CACHE_DOCS + config.rerank_group) * -(-(config.max_doc_tokens + RERANK_DOC_SLACK) // page_size)


def pool_pages(max_batch: int, max_seq_len: int, extra: int = 0, page_size: int = 16) -> int:
    """TextModel.load's default pool (``max_batch`` full sequences) plus ``extra`` pages."""
    return max_batch * -(-max_seq_len // page_size) + 1 + extra


def reranker_role(config: RAGConfig, drafter: str, verifier: str) -> str | None:
    """The role ("drafter" or "verifier") whose loaded model is the reranker; None for another model."""
    name = config.reranker or "drafter"
    return "drafter" if name in ("drafter", drafter) else "verifier" if name in ("verifier", verifier) else None


def build_reranker(config: RAGConfig, model: TextModel, kv_dir=None) -> Scorer | None:
    """None without reranking; else a Reranker on ``model`` in ``config.rerank`` mode ("kv": with a DocKVStore
    in ``kv_dir``; None: the store's default, ``<cache root>/doc_kv``)."""
    if config.rerank == "none":
        return None
    store = DocKVStore(kv_dir, model) if config.rerank == "kv" else None
    return Reranker(
        model, store=store, mode=config.rerank, max_doc_tokens=config.max_doc_tokens, cache_docs=RERANK_CACHE_DOCS
    )


def deferrable(name: str, load: Callable[[], TextModel]) -> DeferredTextModel | None:
    """A ``DeferredTextModel`` of ``name``, or None where its tokenizer and config cannot be read without loading it
    (a model only its loader knows: it is then loaded at once, and a bad name fails there with its own error)."""
    try:
        return DeferredTextModel(name, load)
    except (SpecRagError, OSError, ValueError, KeyError):  # the eager load reports a bad file in its own words
        return None


def build_specrag(
    drafter: str = DEFAULT_DRAFTER,
    verifier: str = DEFAULT_VERIFIER,
    corpus: str | os.PathLike | Sequence[dict] | None = None,
    config: RAGConfig | None = None,
    max_seq_len: int = 2048,
    drafter_placement=None,
    verifier_placement=None,
    kv_dir: str | os.PathLike | None = None,
    drafter_transform: Callable[[ModelConfig, dict], dict] | None = None,
    drafter_adapter: str | None = None,
    defer_drafter: bool = True,
) -> SpecRAG:
    """Load both models, a BM25 index over ``corpus`` (a path or documents; None: the built-in corpus) and, when
    ``config.rerank`` is not "none", the reranker (on the drafter unless ``config.reranker`` names a model).

    ``*_placement``: optional ``specrag_jax.parallel.Placement`` per model (a device mesh; disjoint meshes let
    drafting and verification run on separate devices). ``kv_dir``: the document K/V store (``--rerank kv``; default
    ``cache_root()/doc_kv``, where ``specrag index`` writes). ``drafter_transform``: applied to the drafter's
    weights at load (``training.lora_merge.adapter_transform(name, DIR)`` merges a ``specrag train`` run); without one,
    ``drafter_adapter`` is merged: a train or export folder, a shipped adapter's name, "none", or None for the
    drafter's default (``adapters.DEFAULT_ADAPTERS``: the tuned ``smollm2-rag-drafter`` for SmolLM2-135M-Instruct;
    ``SpecRAG.drafter_adapter`` records which). A reranker
    on the drafter or verifier shares its page pool, which gets ``reranker_pages`` more pages for the reranker's
    cached documents. ``defer_drafter``: the drafter loads on first use (a ``DeferredTextModel``; the router's exact
    path never loads it) unless it reranks or embeds for clustering, which need it at once."""
    config = config or RAGConfig()
    config.check()
    if config.shared_vocab == "require":  # before any weights load: the tokenizers alone decide
        require_same_vocabulary(drafter, load_tokenizer(drafter), verifier, load_tokenizer(verifier))
    custom = drafter_transform is not None
    adapter = None if custom else default_adapter(drafter, drafter_adapter)
    drafter_transform = drafter_transform or adapter_transform(drafter, adapter)  # checks the name before loading
    # an adapter made for another model is refused when it is merged (its weights' fingerprint), so a drafter whose
    # adapter names another base, or whose weights go through a caller's transform, loads now: errors at build
    role = reranker_role(config, drafter, verifier) if config.rerank != "none" else None
    extra = reranker_pages(config)  # a shared model's pool also holds the reranker's pages
    pages = {
        r: pool_pages(b, max_seq_len, extra) if role == r else None
        for r, b in (("drafter", max(config.m, 1)), ("verifier", 2))
    }
    load_drafter = functools.partial(
        TextModel.load,
        drafter,
        max_seq_len=max_seq_len,
        max_batch=max(config.m, 1),
        num_pages=pages["drafter"],
        placement=drafter_placement,
        transform_params=drafter_transform,
    )
    load_verifier = functools.partial(
        TextModel.load,
        verifier,
        max_seq_len=max_seq_len,
        max_batch=2,
        num_pages=pages["verifier"],
        placement=verifier_placement,
    )
    deferred = None
    checked = not custom and (adapter is None or adapter_info(adapter).get("base_model") == drafter)
    if defer_drafter and checked and role != "drafter" and config.clustering != "drafter":
        # loaded on first use: the router's exact path never drafts (its name, tokenizer and config are read now)
        deferred = deferrable(drafter, load_drafter)
    if deferred is not None:
        drafter_model: TextModel | DeferredTextModel = deferred
        verifier_model = load_verifier()
    else:
        # The two models load on two threads: a first run assembles and converts the verifier while the drafter
        # converts and merges its adapter; later runs overlap the adapter merge and both tokenizers.
        with ThreadPoolExecutor(2, thread_name_prefix="specrag-load") as pool:
            verifier_future = pool.submit(load_verifier)
            drafter_model = load_drafter()
            verifier_model = verifier_future.result()
    if corpus is None or isinstance(corpus, (str, os.PathLike)):
        docs = default_corpus() if corpus is None else load_corpus(corpus)
    else:
        docs = list(corpus)
    index = LexicalIndex.build(docs)
    scorer = None
    if config.rerank != "none":
        model = {"drafter": drafter_model, "verifier": verifier_model}.get(role) or TextModel.load(
            config.reranker,
            max_seq_len=max_seq_len,
            placement=drafter_placement,
            num_pages=pool_pages(1, max_seq_len, extra),
        )
        scorer = build_reranker(config, model, kv_dir)
    rag = SpecRAG(
        drafter_model,
        verifier_model,
        subsets=subset_sampler(config.clustering, drafter_model, config.subsets),
        search=lexical_search(index),
        config=config,
        reranker=scorer,
    )
    rag.drafter_adapter = adapter
    return rag
