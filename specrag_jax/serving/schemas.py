"""The OpenAI-compatible request bodies (pydantic, unknown fields refused). Field names are the public contract;
/v1/rag's request and response are in ``rag_schemas.py``.

The OpenAI bodies take what the official ``openai`` SDK sends; a field this server cannot honour is a one-line
400 naming it: "unsupported" (never served here) or "not supported yet"."""

from __future__ import annotations

from typing import Annotated, Any, Iterator, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

MAX_TOKENS = 4096
MAX_N = 16  # choices per prompt


class StrictModel(BaseModel):
    """A request body that refuses unknown fields."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(StrictModel):
    include_usage: bool = Field(False, description="a last chunk with `usage` and no choices, before [DONE]")
    include_obfuscation: bool | None = Field(None, description="accepted, ignored (chunks are never padded)")


class SamplingRequest(StrictModel):
    """What /v1/completions and /v1/chat/completions share. ``null`` is the default, as in OpenAI's API; a field
    this server cannot honour is a 400 naming it (``problems``)."""

    model: str | None = Field(None, max_length=200)
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy (the default here)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=100000)
    seed: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="the same seed, the same output (with the same settings); none: a random one",
    )
    stop: str | list[str] | None = Field(None, description="up to 4 stop strings")
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    n: int = Field(1, ge=1, le=MAX_N, description="choices per prompt (they share the prompt's K/V pages)")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus f x count of each generated token")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus p for each token generated so far")
    repetition_penalty: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="divides the positive (multiplies the "
        "negative) logits of prompt and generated tokens (vLLM's extension)",
    )
    logit_bias: dict[str, float] | None = Field(None, description="only {} (not supported yet)")
    user: str | None = Field(None, max_length=200, description="accepted, ignored")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """A known field sent as ``null`` takes its default (OpenAI clients send ``null`` for "not set")."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        return data

    @model_validator(mode="after")
    def _refuse(self) -> "SamplingRequest":
        for message in self.problems():
            raise PydanticCustomError("unsupported", "{message}", {"message": message})
        return self

    def problems(self) -> Iterator[str]:
        """One-line messages on fields given with values this server does not honour (the first is the 400)."""
        if self.stream_options is not None and not self.stream:
            yield "stream_options is only allowed with stream: true"
        if self.logit_bias:
            yield "logit_bias is not supported yet"

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s][:4]

    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
        return self.stream_options is not None and self.stream_options.include_usage


class ContentPart(BaseModel):
    """One part of a message's ``content`` list; only ``{"type": "text", "text": ...}`` is served."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=100)
    text: str | None = Field(None, max_length=200_000)


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"] = Field(description="developer = system")
    content: Union[Annotated[str, Field(max_length=200_000)], Annotated[list[ContentPart], Field(max_length=64)]] = (
        Field(description="a string, or a list of text parts (joined by newlines)")
    )
    name: str | None = Field(None, max_length=200, description="accepted, ignored")

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str):
                raise PydanticCustomError("invalid", "each content part needs a 'type'")
            if kind != "text":
                raise PydanticCustomError(
                    "unsupported",
                    "content part type {kind} is unsupported (only 'text' parts)",
                    {"kind": repr(kind)[:100]},
                )
            if not isinstance(part.get("text"), str):
                raise PydanticCustomError("invalid", "a 'text' content part needs a string 'text'")
        return content

    def turn(self) -> dict[str, str]:
        """The message as a chat-template turn: text parts joined by newlines, a developer turn as a system one."""
        text = self.content if isinstance(self.content, str) else "\n".join(p.text or "" for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=64)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="default 64")
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="the same as max_tokens")
    response_format: dict[str, Any] | None = Field(None, description='only {"type": "text"}')
    tools: list[dict[str, Any]] | None = Field(None, description="only [] (no tool calling)")
    tool_choice: str | dict[str, Any] | None = Field(None, description='"none" or "auto" (with no tools)')
    functions: list[dict[str, Any]] | None = Field(None, description="only [] (no function calling)")
    function_call: str | dict[str, Any] | None = Field(None, description='"none" or "auto" (with no functions)')
    audio: dict[str, Any] | None = Field(None, description="unsupported (text output only)")
    modalities: list[str] | None = Field(None, description='only ["text"]')
    logprobs: bool = Field(False, description="the log-probability of each generated token")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="and of the N likeliest (needs logprobs)")
    metadata: dict[str, str] | None = Field(None, description="accepted, ignored")
    store: bool | None = Field(None, description="accepted, ignored (nothing is stored)")
    parallel_tool_calls: bool | None = Field(None, description="accepted, ignored")
    service_tier: str | None = Field(None, max_length=50, description="accepted, ignored")

    def problems(self) -> Iterator[str]:
        yield from super().problems()
        if self.max_tokens and self.max_completion_tokens and self.max_tokens != self.max_completion_tokens:
            yield (
                f"max_tokens ({self.max_tokens}) and max_completion_tokens ({self.max_completion_tokens}) "
                "differ; give one of them"
            )
        kind = (self.response_format or {"type": "text"}).get("type")
        if kind != "text":
            yield f"response_format type {str(kind)[:50]!r} is unsupported (only 'text')"
        for name in ("tools", "functions"):
            if getattr(self, name):
                yield f"{name} is unsupported: this server does not call tools (only [] is accepted)"
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none", "auto"):
                yield f"{name} is unsupported: this server does not call tools (only 'none' or 'auto')"
        if self.audio is not None:
            yield "audio is unsupported: this server writes text only"
        if self.modalities not in (None, ["text"]):
            yield "modalities is unsupported beyond ['text']: this server writes text only"
        if self.top_logprobs and not self.logprobs:
            yield "top_logprobs needs logprobs: true"

    def token_limit(self) -> int:
        """The most tokens to generate: ``max_tokens`` or ``max_completion_tokens`` (default 64)."""
        return self.max_tokens or self.max_completion_tokens or 64

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def top_n(self) -> int:
        return self.top_logprobs or 0


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] = Field(description="a prompt or a list of up to 16 prompts")
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)
    logprobs: int | None = Field(None, ge=0, le=20, description="each token's log-probability and the N likeliest")
    echo: bool = Field(False, description="only false (not supported yet)")
    best_of: int | None = Field(None, ge=1, le=20, description="only 1 (not supported yet)")
    suffix: str | None = Field(None, max_length=1000, description="not supported yet")

    def problems(self) -> Iterator[str]:
        yield from super().problems()
        for name, given in (
            ("echo", self.echo),
            ("best_of", self.best_of not in (None, 1)),
            ("suffix", bool(self.suffix)),
        ):
            if given:
                yield f"{name} is not supported yet"

    def token_limit(self) -> int:
        return self.max_tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def top_n(self) -> int:
        return self.logprobs or 0
