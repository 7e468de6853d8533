"""/v1/rag's request body, its JSON answer and the error body, as pydantic models (the OpenAPI document's schemas).

Field names and shapes are the public contract. The answer is what ``RAGAnswer.to_dict`` returns; the app sends
that dict as it is (the models document it, they never filter it), and ``tests/serving/test_rag_schema.py``
validates served answers against the published schema so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from specrag_jax.pipeline.reranking import RERANK_MODES
from specrag_jax.pipeline.selection import SELECTIONS
from specrag_jax.pipeline.specrag import DEFAULT_METHOD, METHODS
from specrag_jax.serving.rag_trace import RagTrace
from specrag_jax.serving.schemas import StrictModel


class Document(StrictModel):
    """A passage given with the question."""

    id: str | int = Field(description="its id, as cited in `citations` (sent back as a string)")
    title: str = Field("", description="its title (read before the text)")
    text: str = Field(description="the passage")


class RagRequest(StrictModel):
    """A question for the RAG pipeline; a field left out (or null) takes the server's setting."""

    question: str = Field(min_length=1, max_length=10_000, description="the question to answer")
    documents: list[Union[str, Document]] | None = Field(
        None, max_length=64, description="passages; without them the server's corpus is searched"
    )
    method: Literal[METHODS] = Field(  # type: ignore[valid-type]
        DEFAULT_METHOD,
        description="auto (the default: the router picks the exact path or the cascade per question) | speculative "
        "(the cascade: drafts + verifier) | standard | closed_book | drafter_only | random_draft | lossless",
    )
    m: int | None = Field(None, ge=1, le=16, description="number of drafts")
    k: int | None = Field(None, ge=1, le=16, description="number of clusters")
    rerank: Literal[RERANK_MODES] | None = Field(  # type: ignore[valid-type]
        None, description="none | kv | recompute (default: the server's)"
    )
    reranker: str | None = Field(None, max_length=200, description="the server's reranker model (name or role)")
    n_coarse: int | None = Field(None, ge=1, le=1000, description="coarse candidates reranked (corpus search)")
    rerank_group: int | None = Field(None, ge=1, le=100, description="candidates per fine-reranker group")
    rerank_patience: int | None = Field(None, ge=1, le=1000, description="stable groups before reranking stops")
    progressive_prefill: int | None = Field(None, ge=0, le=1000, description="stable groups before prefilling")
    selection: Literal[SELECTIONS] | None = Field(  # type: ignore[valid-type]
        None, description="rho | evidence, optionally +agg then +ground (default: the server's)"
    )
    tau_min: float | None = Field(
        None, ge=0.0, le=1.0, description="the cascade's confidence floor (0: never falls back; default: the server's)"
    )
    stream: bool = Field(False, description="send server-sent events: stage events, then the result event")

    def rag_options(self) -> dict:
        """The RAGConfig fields this request overrides (None: the server's default)."""
        names = (
            "m",
            "k",
            "rerank",
            "reranker",
            "n_coarse",
            "rerank_group",
            "rerank_patience",
            "progressive_prefill",
            "selection",
            "tau_min",
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class RagDraft(BaseModel):
    """One draft and its scores (log-probabilities; 0.0 where a verification pass did not run)."""

    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0, description="its position among the drafts")
    doc_ids: list[str] = Field(description="ids of the documents it was written from (one subset)")
    text: str = Field(description="the drafter's text: `## Rationale: ...` then `## Response: ...`")
    rationale: str = Field(description="the rationale part")
    answer: str = Field(description="the response part (a closed-set question: its label)")
    parsed: bool = Field(description="it followed the rationale/response format")
    draft_logprob: float = Field(description="log P(draft | subset) under the drafter (rho_draft)")
    draft_tokens: int = Field(ge=0, description="tokens the drafter generated for it")
    sc_logprob: float = Field(description="log P(draft | question) under the verifier (rho_SC)")
    sc_tokens: int = Field(ge=0, description="tokens scored for sc_logprob")
    sr_logprob: float = Field(description='log P("Yes") to "does the explanation support the answer" (rho_SR)')
    sr_no_logprob: float = Field(description='log P("No") to the same')
    ev_sc_logprob: float = Field(description="log P(draft | its own passages) under the verifier")
    ev_sc_tokens: int = Field(ge=0, description="tokens scored for ev_sc_logprob")
    ev_sr_logprob: float = Field(description='log P("Yes") to "is the response supported by the evidence"')
    ev_sr_no_logprob: float = Field(description='log P("No") to the same')
    score: float = Field(description="the score the selection ranked it by (higher is better)")
    grounded: bool | None = Field(
        None, description="whether the answer occurs in the draft's own passages (null: not checked, closed set)"
    )


class RagResponse(BaseModel):
    """The answer, how it was reached and what it cost (the JSON shape of ``specrag ask --json``)."""

    model_config = ConfigDict(extra="forbid")
    answer: str = Field(description="the answer (`unanswerable` from the unanswerable fallback)")
    rationale: str = Field(description="the chosen draft's rationale; empty when the verifier answered itself")
    citations: list[str] = Field(
        description="ids of the documents behind the answer: the chosen draft's subset, "
        "or every document the verifier read"
    )
    drafts: list[RagDraft] = Field(description="every draft with its scores (none for standard and closed_book)")
    trace: RagTrace = Field(description="per-stage timings, token counts and decisions")
    method: Literal[METHODS] = Field(description="the method that answered")  # type: ignore[valid-type]


class ErrorDetail(BaseModel):
    """What went wrong, in one line."""

    model_config = ConfigDict(extra="forbid")
    message: str = Field(description="one line naming the problem (the field, for a bad request)")
    type: str = Field(
        description="invalid_request_error | request_too_large | rate_limit_error | timeout | "
        "unavailable | cancelled | server_error"
    )


class ErrorResponse(BaseModel):
    """Every error of the API: ``{"error": {"message", "type"}}``."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail
