"""The ``trace`` of a /v1/rag answer (and of ``specrag ask --json``), described for the OpenAPI document.

A trace holds only the keys of the stages that ran: retrieval and (with ``rerank``) reranking always,
clustering, drafting and verification for the drafting methods, generation for standard RAG, closed book,
lossless and the cascade's fallback. Pipeline pieces the Python API plugs in (a custom subset sampler, say)
may add keys of their own, so the object stays open; ``tests/serving/test_rag_schema.py`` checks that every key
the served pipeline writes is listed here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

Count = Annotated[int, Field(ge=0)]


@with_config(ConfigDict(extra="forbid"))
class RerankTrace(TypedDict):
    """The coarse-to-fine reranking of the candidates (``rerank`` other than ``none``)."""

    mode: Annotated[Literal["kv", "recompute"], Field(description="how the reranker read the candidates")]
    candidates: Annotated[Count, Field(description="candidates from the search (or the documents given)")]
    groups_total: Annotated[Count, Field(description="groups of ``rerank_group`` candidates")]
    groups_scored: Annotated[Count, Field(description="groups the reranker scored before stopping")]
    candidates_scored: Annotated[Count, Field(description="candidates the reranker scored")]
    stopped_at: Annotated[Count, Field(description="coarse rank where scoring stopped")]
    early: Annotated[bool, Field(description="stopped before the candidates ran out (``rerank_patience``)")]
    stable_groups: Annotated[Count, Field(description="groups in a row that left the top set unchanged")]
    saved_fraction: Annotated[float, Field(ge=0.0, le=1.0, description="share of the candidates not scored")]
    rerank_s: Annotated[float, Field(description="seconds reranking took")]


@with_config(ConfigDict(extra="forbid"))
class ProgressiveTrace(TypedDict):
    """Progressive prefill (``progressive_prefill`` > 0): prompts prefilled while reranking went on."""

    trigger_stable_groups: Annotated[Count, Field(description="stable rerank groups that start a prefill")]
    launches: Annotated[Count, Field(description="prefills started")]
    launch_groups: Annotated[list[int], Field(description="the rerank group after which each prefill started")]
    cancelled: Annotated[Count, Field(description="prefills cancelled because the top set changed")]
    prefill_cached_tokens: Annotated[Count, Field(description="prompt tokens the prefix cache then served")]
    notes: Annotated[list[str], Field(description="prefills that did not start or finish, and why")]
    final_was_prefilled: Annotated[bool, Field(description="the final document set had been prefilled")]
    settle_s: Annotated[float, Field(description="seconds waited for prefills in flight after reranking")]


@with_config(ConfigDict(extra="forbid"))
class SpeculationCounts(TypedDict):
    """Raw counts of the verifier's speculative decode (summable over questions)."""

    steps: Annotated[Count, Field(description="verifier steps")]
    proposed: Annotated[Count, Field(description="proposed tree tokens")]
    accepted: Annotated[Count, Field(description="proposed tokens accepted")]
    emitted: Annotated[Count, Field(description="tokens emitted (accepted + one bonus token per step)")]
    histogram: Annotated[dict[str, int], Field(description="tokens emitted in a step -> steps")]


@with_config(ConfigDict(extra="forbid"))
class SpeculationTrace(TypedDict):
    """The lossless path's token-tree speculation (method ``lossless``, or the cascade's standard fallback)."""

    counts: Annotated[SpeculationCounts, Field(description="raw counts")]
    steps: Annotated[Count, Field(description="verifier steps")]
    accepted_tokens_per_step: Annotated[float, Field(description="tokens emitted per step (plain decoding: 1.0)")]
    proposed_tokens_per_step: Annotated[float, Field(description="proposed tree tokens per step")]
    draft_tokens_accepted_per_step: Annotated[float, Field(description="accepted proposed tokens per step")]
    tokens_per_step_histogram: Annotated[dict[str, int], Field(description="tokens emitted in a step -> steps")]


@with_config(ConfigDict(extra="forbid"))
class RouteTrace(TypedDict, total=False):
    """The router's decision (method ``auto``, ``pipeline/router.py``) and what it was made from."""

    path: Annotated[Literal["exact", "cascade"], Field(description="the path taken")]
    predicted_s: Annotated[dict[str, float], Field(description="each path's expected seconds (exact, cascade)")]
    stages_s: Annotated[
        dict[str, float], Field(description="each stage's predicted seconds (exact, drafting, verification, fallback)")
    ]
    acceptance: Annotated[
        dict[str, float],
        Field(description="P(the cascade accepts), P(accepts a right draft), P(accepts where standard was right)"),
    ]
    accuracy_change: Annotated[float, Field(description="the cascade's expected accuracy minus standard RAG's")]
    break_even_accept: Annotated[float, Field(description="P(accept) from which the cascade is faster (> 1: never)")]
    platform: Annotated[str, Field(description="the JAX backend it decided for (cpu, gpu, tpu)")]
    peaks: Annotated[dict, Field(description="the matmul rate and bandwidth it predicted with, and their source")]
    reason: Annotated[str, Field(description="the decision in words")]
    decide_s: Annotated[float, Field(description="seconds the decision took")]
    counts: Annotated[dict[str, float], Field(description="the prompt sizes it predicted from (tokens)")]
    measured_s: Annotated[float, Field(description="seconds the answer took, without one-time compilation")]


@with_config(ConfigDict(extra="allow"))
class RagTrace(TypedDict, total=False):
    """Per-stage timings (seconds), token counts and the decisions taken; only the stages that ran appear."""

    notes: Annotated[list[str], Field(description="adjustments made on the way (a document truncated, ...)")]
    documents: Annotated[list[str], Field(description="ids of the documents read, best first after reranking")]
    retrieval_s: Annotated[float, Field(description="seconds of corpus search (0.0 with documents given)")]
    compile_s: Annotated[float, Field(description="seconds of one-time XLA compilation within total_s")]
    rerank_s: Annotated[float, Field(description="seconds of reranking")]
    rerank: Annotated[RerankTrace, Field(description="the reranking (rerank kv or recompute)")]
    prefill_wait_s: Annotated[float, Field(description="seconds waited for progressive prefills after reranking")]
    progressive: Annotated[ProgressiveTrace, Field(description="progressive prefill (progressive_prefill > 0)")]
    clustering_s: Annotated[float, Field(description="seconds of embedding, k-means and subset sampling")]
    num_subsets: Annotated[Count, Field(description="document subsets, one per draft")]
    clusters: Annotated[Count, Field(description="k-means clusters")]
    cluster_sizes: Annotated[list[int], Field(description="documents per cluster")]
    subsets_mode: Annotated[
        Literal["sample", "cover"], Field(description="one passage per cluster per draft, or drafts covering all")
    ]
    clustering_tokens: Annotated[Count, Field(description="tokens the embedder read")]
    clustering_steps: Annotated[Count, Field(description="embedder steps")]
    clustering_question_tokens: Annotated[Count, Field(description="question tokens read by the embedder")]
    clustering_docs: Annotated[Count, Field(description="documents embedded")]
    subset_notes: Annotated[list[str], Field(description="why fewer subsets (drafts) than m were made")]
    drafting_s: Annotated[float, Field(description="seconds of drafting (all drafts in one batched generation)")]
    drafting_compile_s: Annotated[float, Field(description="of drafting_s, one-time XLA compilation on its thread")]
    drafter_prefill_tokens: Annotated[Count, Field(description="prompt tokens the drafter prefilled")]
    drafter_shared_prefix_tokens: Annotated[Count, Field(description="of them, the prefix the drafts share (once)")]
    drafter_decode_tokens: Annotated[Count, Field(description="tokens the drafter generated")]
    drafter_decode_steps: Annotated[Count, Field(description="drafter decode steps (the longest draft's tokens)")]
    drafter_first_token_s: Annotated[float, Field(description="seconds from drafting to the first draft token")]
    parsed_drafts: Annotated[Count, Field(description="drafts that followed the rationale/response format")]
    first_draft_token_s: Annotated[float, Field(description="seconds from the start to the first draft token")]
    verification_s: Annotated[float, Field(description="seconds of plain verification (rho)")]
    verification_compile_s: Annotated[float, Field(description="of verification_s, one-time XLA compilation")]
    verifier_prefix_tokens: Annotated[Count, Field(description="prefix tokens of the plain verification")]
    verifier_tree_tokens: Annotated[Count, Field(description="tokens in the plain verification tree")]
    verifier_scored_rows: Annotated[
        Count, Field(description="tree rows whose logits the plain verification reads (every draft token, Yes/No)")
    ]
    verifier_prefix_cached_tokens: Annotated[
        Count, Field(description="of verifier_prefix_tokens, those the prefix cache served (not computed)")
    ]
    evidence_verification_s: Annotated[float, Field(description="seconds of evidence-aware verification")]
    evidence_verification_compile_s: Annotated[
        float, Field(description="of evidence_verification_s, one-time XLA compilation")
    ]
    evidence_prefix_tokens: Annotated[Count, Field(description="prefix tokens of evidence verification")]
    evidence_tree_tokens: Annotated[Count, Field(description="tokens in the evidence verification tree")]
    evidence_scored_rows: Annotated[
        Count, Field(description="tree rows whose logits evidence verification reads (every draft token, Yes/No)")
    ]
    evidence_prefix_cached_tokens: Annotated[
        Count, Field(description="of evidence_prefix_tokens, those the prefix cache served (not computed)")
    ]
    consensus: Annotated[bool, Field(description="all drafts agreed, verification skipped (``consensus``)")]
    confidence: Annotated[float, Field(description="the chosen draft's confidence, compared with tau_min")]
    confidence_bound: Annotated[
        float,
        Field(
            description="the most any draft's support could be before verification (the largest share of drafts "
            "agreeing on an answer); under tau_min the cascade falls back without verifying"
        ),
    ]
    selection: Annotated[str, Field(description="rho | evidence, optionally +agg then +ground")]
    chosen_draft: Annotated[Count, Field(description="index of the chosen draft (also when it was not accepted)")]
    fallback: Annotated[Literal["standard", "unanswerable"], Field(description="the cascade's fallback, when taken")]
    path: Annotated[
        str, Field(description="verified_draft | fallback | consensus | drafter_only | random_draft | exact (auto)")
    ]
    generation_s: Annotated[float, Field(description="seconds of the verifier's own answer")]
    verifier_prefill_tokens: Annotated[Count, Field(description="prompt tokens of the verifier's answer")]
    verifier_decode_tokens: Annotated[Count, Field(description="tokens the verifier generated for its answer")]
    verifier_decode_s: Annotated[float, Field(description="seconds the verifier spent decoding its answer")]
    answer_cut: Annotated[
        bool, Field(description="the answer budget ended the verifier's answer (not its end of turn or line)")
    ]
    verifier_prefill_compile_s: Annotated[
        float, Field(description="of the answer's prefill, one-time XLA compilation on the engine's thread")
    ]
    verifier_decode_compile_s: Annotated[
        float, Field(description="of verifier_decode_s, one-time XLA compilation on the engine's thread")
    ]
    speculation: Annotated[SpeculationTrace, Field(description="token-tree speculation of the lossless path")]
    route: Annotated[RouteTrace, Field(description="method auto: the router's decision, predictions and measure")]
    drafter_load_s: Annotated[float, Field(description="seconds loading a drafter deferred until this first use")]
    total_s: Annotated[float, Field(description="seconds this method took in all (shared stages included)")]
