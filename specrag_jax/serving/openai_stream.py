"""Streamed OpenAI completions: server-sent chunks for each of one prompt's ``n`` choices as tokens arrive.

Text is held back while it may still turn into a stop string. With logprobs, a text chunk carries the
log-probabilities of the tokens that arrived since the choice's previous chunk (read from the engine's
sequence, which records them before it calls ``on_token``); the rest go with the choice's last text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import AsyncIterator

from specrag_jax.models.engine.requests import Request
from specrag_jax.models.text_model import TextModel
from specrag_jax.models.tokenizer.detokenize import IncrementalDetokenizer
from specrag_jax.serving.openai_choices import cut, finish_reason, logprobs_of, usage
from specrag_jax.serving.openai_logprobs import tokens_for_text
from specrag_jax.serving.sse import abandon, queued_until_done, sse

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StreamSpec:
    model: TextModel
    stops: list[str]
    rid: str
    created: int
    chat: bool
    include_usage: bool  # every chunk has ``usage: null``; a last chunk with no choices carries the usage
    logprobs: bool


class _Choice:
    def __init__(self, decode) -> None:
        self.detok = IncrementalDetokenizer(decode)
        self.sent = ""  # text sent so far
        self.sent_tokens = 0  # tokens whose log-probabilities were sent


async def stream_chunks(req: Request, queue: asyncio.Queue, spec: StreamSpec) -> AsyncIterator[bytes]:
    """The chunks of ``req`` (one prompt, a branch per choice); ``queue`` receives ``(branch, token)``."""
    chat, decode = spec.chat, spec.model.tokenizer.decode
    hold = max((len(s) for s in spec.stops), default=1) - 1  # text that may still turn into a stop string
    head = {
        "id": spec.rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": spec.created,
        "model": spec.model.name,
    }
    if spec.include_usage:
        head["usage"] = None
    choices = [_Choice(decode) for _ in req.suffixes]

    def chunk(b: int, delta: str | None, finish: str | None = None, upto: int = 0, ids=(), lps=(), tops=None):
        ch = choices[b]
        logp = None
        if spec.logprobs and upto > ch.sent_tokens:
            k0, ch.sent_tokens = ch.sent_tokens, upto
            logp = logprobs_of(
                decode, chat, ids[k0:upto], lps[k0:upto], tops[k0:upto] if tops else None, offset=len(ch.sent)
            )
        ch.sent += delta or ""
        if chat:
            c = {"index": b, "delta": {} if delta is None else {"content": delta}, "finish_reason": finish}
            if spec.logprobs:
                c["logprobs"] = logp
        else:
            c = {"index": b, "text": delta or "", "finish_reason": finish, "logprobs": logp}
        return sse({**head, "choices": [c]})

    fut = asyncio.wrap_future(req.future)
    try:
        if chat:
            for b in range(len(choices)):
                yield sse({**head, "choices": [{"index": b, "delta": {"role": "assistant"}, "finish_reason": None}]})
        async for b, token in queued_until_done(queue, fut):
            ch = choices[b]
            ch.detok.push(token)
            text, stopped = cut(ch.detok.text, spec.stops)
            ready = text if stopped else text[: max(len(text) - hold, len(ch.sent))]
            if len(ready) > len(ch.sent):
                seq = next(s for s in req.seqs if s.branch == b)
                yield chunk(
                    b,
                    ready[len(ch.sent) :],
                    upto=len(ch.detok.ids),
                    ids=ch.detok.ids,
                    lps=seq.logprobs,
                    tops=seq.top_logprobs,
                )
        try:
            results = await fut
        except Exception as exc:  # timeout / cancellation mid-stream: tell the client, end the stream
            yield sse({"error": {"message": str(exc), "type": type(exc).__name__}})
            return
        for b, r in enumerate(results):
            text, stopped = cut(decode(r.token_ids), spec.stops)
            upto = tokens_for_text(decode, r.token_ids, text) if stopped else len(r.token_ids)
            rest = text[len(choices[b].sent) :] if len(text) > len(choices[b].sent) else None
            parts = dict(upto=upto, ids=r.token_ids, lps=r.logprobs, tops=r.top_logprobs)
            if rest is not None:
                yield chunk(b, rest, **parts)
                parts = {}
            yield chunk(b, None, finish_reason(r, stopped), **parts)
        if spec.include_usage:
            yield sse({**head, "choices": [], "usage": usage(results, len(results))})
        yield sse("[DONE]")
    finally:
        if not req.future.done():
            req.cancel()  # the client went away mid-stream: the engine drops the work, its pages return
            log.info("request %s cancelled by the client", spec.rid)
        abandon(fut)
