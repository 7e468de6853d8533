"""OpenAI-compatible /v1/models, /v1/completions and /v1/chat/completions (JSON or server-sent events)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import AsyncIterator, Sequence

from fastapi import HTTPException
from fastapi.responses import JSONResponse, StreamingResponse

from specrag_jax.errors import SpecRagError
from specrag_jax.models.generation import GenerationResult
from specrag_jax.models.sampling import SamplingParams
from specrag_jax.models.speculative import combine_stats
from specrag_jax.models.text_model import TextModel
from specrag_jax.serving.detokenize import IncrementalDetokenizer
from specrag_jax.serving.requests import RequestTimeout
from specrag_jax.serving.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from specrag_jax.serving.service import Service

log = logging.getLogger(__name__)


def sse(data) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def chat_prompt(model: TextModel, messages: list[dict]) -> list[int]:
    """Token ids of a conversation in the model's chat template (a plain transcript when it has none)."""
    tok = model.tokenizer
    if tok.chat_template:
        ids = tok.encode(tok.apply_chat_template(messages), add_bos=False)
        if tok.add_bos_default and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id] + ids
        return ids
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return tok.encode(text, add_bos=tok.add_bos_default)


def _cut(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _stop_fn(model: TextModel, stops: list[str]):
    if not stops:
        return None
    decode = model.tokenizer.decode
    return lambda _row, out: any(s in decode(out[-16:]) for s in stops)


def _sampling(body: _Sampling) -> SamplingParams:
    return SamplingParams(body.temperature, body.top_k, body.top_p, body.seed or 0)


def _finish(r: GenerationResult, stopped: bool) -> str:
    return "stop" if stopped or r.finish_reason in ("eos", "stop") else "length"


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # marks the exception retrieved


def abandon(fut: asyncio.Future) -> None:
    """Nobody will await ``fut`` (an ``asyncio.wrap_future`` of engine or RAG work) any more: its consumer
    (a stream whose client went away, a handler past its timeout) is gone. The exception it may still get from
    the other thread -- the ``RequestCancelled`` of the work just cancelled -- is expected, so mark it retrieved
    when it comes, instead of asyncio logging "Future exception was never retrieved" when ``fut`` is collected.
    Harmless on a future already awaited."""
    fut.add_done_callback(_retrieve)


async def queued_until_done(queue: asyncio.Queue, future: asyncio.Future) -> AsyncIterator:
    """Yield what arrives on ``queue`` until ``future`` completes (items still queued then stay queued)."""
    get = None
    try:
        while True:
            get = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({get, future}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                return
            yield get.result()
    finally:  # also when the consumer is cancelled or closed mid-wait (client gone): no task left pending
        if get is not None and not get.done():
            get.cancel()


async def until_done_or_gone(request, future: asyncio.Future, cancel) -> object:
    """Await ``future``; if the client disconnects first, call ``cancel`` (the work stops, pages return)."""
    while True:
        done, _ = await asyncio.wait({future}, timeout=0.25)
        if done:
            return future.result()
        if await request.is_disconnected():
            cancel()
            return await future


def _usage(results: Sequence[GenerationResult]) -> dict:
    """OpenAI's ``usage``, plus ``speculation`` (decode steps and tokens per step) when it speculated."""
    prompt = sum(r.num_prompt_tokens for r in results)
    completion = sum(len(r.token_ids) for r in results)
    usage: dict = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if any(r.speculation is not None for r in results):  # extension
        usage["speculation"] = combine_stats([r.speculation for r in results if r.speculation is not None])
    return usage


class OpenAIHandlers:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.created = int(time.time())

    def models(self) -> dict:
        """``GET /v1/models``: every name the ``model`` field takes (``Service.model``): ``default``, the roles
        and the served models' names."""
        names = ["default", *self.service.models, *(m.name for m in self.service.models.values())]
        return {"object": "list", "data": [{"id": n, "object": "model", "created": self.created,
                                            "owned_by": "specrag-jax"} for n in dict.fromkeys(names)]}

    def model(self, model_id: str) -> dict:
        """``GET /v1/models/{id}``; 404 for a name the server does not serve."""
        for card in self.models()["data"]:
            if card["id"] == model_id:
                return card
        raise HTTPException(404, f"model {model_id!r} not found; GET /v1/models lists the served ones")

    async def completions(self, body: CompletionRequest | ChatCompletionRequest, http, chat: bool = False):
        role, model = self.service.model(body.model)
        if chat:
            prompts = [chat_prompt(model, [m.turn() for m in body.messages])]  # type: ignore[attr-defined]
        else:
            texts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
            if not 1 <= len(texts) <= 16 or not all(texts):
                raise SpecRagError("prompt must be a non-empty string or a list of 1 to 16 non-empty strings")
            prompts = [model.encode_prompt(t) for t in texts]
        sampling, stops, limit = _sampling(body), body.stops(), body.token_limit()
        engine = self.service.engines[role]
        timeout = self.service.config.request_timeout
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        if body.stream:
            if len(prompts) != 1:
                raise SpecRagError("stream supports one prompt")
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            req = engine.submit_generate([], prompts, sampling, limit, _stop_fn(model, stops),
                                         on_token=lambda _b, t: loop.call_soon_threadsafe(queue.put_nowait, t),
                                         timeout=timeout, speculation=self.service.speculation())
            stream = self._stream(req, queue, model, stops, rid, created, chat, body.include_usage())
            return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        req = engine.submit_generate([], prompts, sampling, limit, _stop_fn(model, stops), timeout=timeout,
                                     speculation=self.service.speculation())
        fut = asyncio.wrap_future(req.future)
        try:
            results = await asyncio.wait_for(until_done_or_gone(http, fut, req.cancel), timeout + 5)
        except asyncio.TimeoutError:
            raise RequestTimeout("request timed out") from None
        finally:
            if not req.future.done():
                req.cancel()
            abandon(fut)
        choices = []
        for i, r in enumerate(results):
            text, stopped = _cut(model.tokenizer.decode(r.token_ids), stops)
            choice = {"index": i, "finish_reason": _finish(r, stopped), "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            choices.append(choice)
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": model.name, "choices": choices, "usage": _usage(results)})

    async def _stream(self, req, queue: asyncio.Queue, model: TextModel, stops: list[str], rid: str, created: int,
                      chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
        """Server-sent chunks; with ``include_usage`` every chunk has ``usage: null`` and a last chunk with no
        choices carries the usage (OpenAI's ``stream_options``)."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        hold = max((len(s) for s in stops), default=1) - 1  # text that may still turn into a stop string
        head = {"id": rid, "object": obj, "created": created, "model": model.name}
        if include_usage:
            head["usage"] = None

        def chunk(delta: str | None, finish: str | None = None) -> bytes:
            if chat:
                d = {} if delta is None else {"content": delta}
                c = {"index": 0, "delta": d, "finish_reason": finish}
            else:
                c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return sse({**head, "choices": [c]})

        detok = IncrementalDetokenizer(model.tokenizer.decode)
        sent = ""
        fut = asyncio.wrap_future(req.future)
        try:
            if chat:
                yield sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            async for token in queued_until_done(queue, fut):
                detok.push(token)
                text, stopped = _cut(detok.text, stops)
                ready = text if stopped else text[: max(len(text) - hold, len(sent))]
                if len(ready) > len(sent):
                    yield chunk(ready[len(sent):])
                    sent = ready
            try:
                [result] = await fut
            except Exception as exc:  # timeout / cancellation mid-stream: tell the client, end the stream
                yield sse({"error": {"message": str(exc), "type": type(exc).__name__}})
                return
            text, stopped = _cut(model.tokenizer.decode(result.token_ids), stops)
            if len(text) > len(sent):
                yield chunk(text[len(sent):])
            yield chunk(None, _finish(result, stopped))
            if include_usage:
                yield sse({**head, "choices": [], "usage": _usage([result])})
            yield sse("[DONE]")
        finally:
            if not req.future.done():
                req.cancel()  # the client went away mid-stream: the engine drops the work, its pages return
                log.info("request %s cancelled by the client", rid)
            abandon(fut)
