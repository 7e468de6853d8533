"""An OpenAI choice from an engine result: its text cut at the stop strings, finish reason, log-probabilities;
and the response's usage."""

from __future__ import annotations

from typing import Sequence

from specrag_jax.models.engine.requests import TopLogprobs
from specrag_jax.models.generation import GenerationResult
from specrag_jax.models.speculative.decode import combine_stats
from specrag_jax.models.text_model import TextModel
from specrag_jax.serving.openai_logprobs import Decode, chat_logprobs, completion_logprobs, tokens_for_text


def cut(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to its first stop string, and whether one was found."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


def finish_reason(r: GenerationResult, stopped: bool) -> str:
    return "stop" if stopped or r.finish_reason in ("eos", "stop") else "length"


def usage(results: Sequence[GenerationResult], n: int = 1) -> dict:
    """OpenAI's ``usage`` (each prompt counted once, though its ``n`` choices each read it), plus
    ``speculation`` (decode steps and tokens per step) when it speculated."""
    prompt = sum(r.num_prompt_tokens for r in results[::n])
    completion = sum(len(r.token_ids) for r in results)
    out: dict = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if any(r.speculation is not None for r in results):  # extension
        out["speculation"] = combine_stats([r.speculation for r in results if r.speculation is not None])
    return out


def logprobs_of(
    decode: Decode,
    chat: bool,
    ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[TopLogprobs] | None,
    offset: int = 0,
) -> dict:
    """The ``logprobs`` object of a chat or completion choice (or chunk) holding these tokens."""
    if chat:
        return chat_logprobs(decode, ids, logprobs, tops)
    return completion_logprobs(decode, ids, logprobs, tops, offset)


def choice(model: TextModel, r: GenerationResult, index: int, stops: Sequence[str], chat: bool, logprobs: bool) -> dict:
    """One non-streamed choice; with ``logprobs`` those of the tokens that make its (possibly cut) text."""
    decode = model.tokenizer.decode
    text, stopped = cut(decode(r.token_ids), stops)
    c: dict = {"index": index, "finish_reason": finish_reason(r, stopped), "logprobs": None}
    if logprobs:
        k = tokens_for_text(decode, r.token_ids, text) if stopped else len(r.token_ids)
        tops = None if r.top_logprobs is None else r.top_logprobs[:k]
        c["logprobs"] = logprobs_of(decode, chat, r.token_ids[:k], r.logprobs[:k], tops)
    c.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return c
