"""HTTP request bodies (pydantic, unknown fields refused). Field names are the public contract."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from specrag_jax.pipeline.reranking import RERANK_MODES
from specrag_jax.pipeline.specrag import METHODS

MAX_TOKENS = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Sampling(_Strict):
    model: str | None = Field(None, max_length=200)
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy (the default here)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=100000)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    stop: str | list[str] | None = Field(None, description="up to 4 stop strings")
    stream: bool = False
    n: int = Field(1, ge=1, le=1, description="only 1 is supported")
    user: str | None = Field(None, max_length=200)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s][:4]


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=64)
    max_tokens: int = Field(64, ge=1, le=MAX_TOKENS)


class CompletionRequest(_Sampling):
    prompt: str | list[str] = Field(description="a prompt or a list of up to 16 prompts")
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)


class Document(_Strict):
    id: str | int
    title: str = ""
    text: str


class RagRequest(_Strict):
    question: str = Field(min_length=1, max_length=10_000)
    documents: list[Union[str, Document]] | None = Field(
        None, max_length=64, description="passages; without them the server's corpus is searched")
    method: Literal[METHODS] = "speculative"  # type: ignore[valid-type]
    m: int | None = Field(None, ge=1, le=16, description="number of drafts")
    k: int | None = Field(None, ge=1, le=16, description="number of clusters")
    rerank: Literal[RERANK_MODES] | None = Field(None, description="none | kv | recompute (default: the server's)")  # type: ignore[valid-type]
    reranker: str | None = Field(None, max_length=200, description="the server's reranker model (name or role)")
    n_coarse: int | None = Field(None, ge=1, le=1000, description="coarse candidates reranked (corpus search)")
    rerank_group: int | None = Field(None, ge=1, le=100, description="candidates per fine-reranker group")
    rerank_patience: int | None = Field(None, ge=1, le=1000, description="stable groups before reranking stops")
    progressive_prefill: int | None = Field(None, ge=0, le=1000, description="stable groups before prefilling")
    stream: bool = False

    def rag_options(self) -> dict:
        """The RAGConfig fields this request overrides (None: the server's default)."""
        names = ("m", "k", "rerank", "reranker", "n_coarse", "rerank_group", "rerank_patience", "progressive_prefill")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}
