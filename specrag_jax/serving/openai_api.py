"""OpenAI-compatible /v1/models, /v1/completions and /v1/chat/completions (JSON or server-sent events)."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
import uuid

from fastapi import HTTPException
from fastapi.responses import JSONResponse, StreamingResponse

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.requests import RequestTimeout
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.text_model import TextModel
from specrag_jax.serving.openai_choices import choice, usage
from specrag_jax.serving.openai_stream import StreamSpec, stream_chunks
from specrag_jax.serving.schemas import ChatCompletionRequest, CompletionRequest, SamplingRequest
from specrag_jax.serving.service import Service
from specrag_jax.serving.sse import abandon, until_done_or_gone


def chat_prompt(model: TextModel, messages: list[dict]) -> list[int]:
    """Token ids of a conversation in the model's chat template (a plain transcript when it has none)."""
    tok = model.tokenizer
    if tok.chat_template:
        return tok.encode_rendered(tok.apply_chat_template(messages))
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return tok.encode(text, add_bos=tok.add_bos_default)


def _stop_fn(model: TextModel, stops: list[str]):
    if not stops:
        return None
    decode = model.tokenizer.decode
    return lambda _row, out: any(s in decode(out[-16:]) for s in stops)


def branch_seed(seed: int, branch: int) -> int:
    """Choice ``branch``'s seed: the request's for the first, well-spread others for the rest."""
    return (seed + branch * 0x9E3779B9) % 2**32


def sampling_of(body: SamplingRequest) -> list[SamplingParams]:
    """One ``SamplingParams`` per choice (``n``); no ``seed``: a random one (the same seed gives the same
    output)."""
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    base = SamplingParams(
        body.temperature,
        body.top_k,
        body.top_p,
        seed,
        body.presence_penalty,
        body.frequency_penalty,
        body.repetition_penalty,
        body.top_n(),
    )
    return [dataclasses.replace(base, seed=branch_seed(seed, j)) for j in range(body.n)]


class OpenAIHandlers:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.created = int(time.time())

    def models(self) -> dict:
        """``GET /v1/models``: every name the ``model`` field takes (``Service.model``): ``default``, the roles
        and the served models' names."""
        names = ["default", *self.service.models, *(m.name for m in self.service.models.values())]
        return {
            "object": "list",
            "data": [
                {"id": n, "object": "model", "created": self.created, "owned_by": "specrag-jax"}
                for n in dict.fromkeys(names)
            ],
        }

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
        sampling, stops, limit, n = sampling_of(body), body.stops(), body.token_limit(), body.n
        engine = self.service.engines[role]
        timeout = self.service.config.request_timeout
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        work = dict(stop_fn=_stop_fn(model, stops), timeout=timeout, speculation=self.service.speculation())
        if body.stream:  # the n choices of one prompt share its pages (one group: prefix = the prompt)
            if len(prompts) != 1:
                raise SpecRagError("stream supports one prompt")
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            req = engine.submit_generate(
                prompts[0],
                [[]] * n,
                sampling,
                limit,
                **work,
                on_token=lambda b, t: loop.call_soon_threadsafe(queue.put_nowait, (b, t)),
            )
            spec = StreamSpec(model, stops, rid, created, chat, body.include_usage(), body.wants_logprobs())
            return StreamingResponse(
                stream_chunks(req, queue, spec), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        reqs = []
        try:
            for p in prompts:
                reqs.append(engine.submit_generate(p, [[]] * n, sampling, limit, **work))
        except Exception:
            for r in reqs:
                r.cancel()
            raise
        futs = [asyncio.wrap_future(r.future) for r in reqs]
        try:
            groups = await asyncio.wait_for(
                until_done_or_gone(http, asyncio.gather(*futs), lambda: [r.cancel() for r in reqs]), timeout + 5
            )
        except asyncio.TimeoutError:
            raise RequestTimeout("request timed out") from None
        finally:
            for r, f in zip(reqs, futs):
                if not r.future.done():
                    r.cancel()
                abandon(f)
        results = [r for group in groups for r in group]  # choice i * n + j: prompt i, its choice j
        choices = [choice(model, r, i, stops, chat, body.wants_logprobs()) for i, r in enumerate(results)]
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model.name,
                "choices": choices,
                "usage": usage(results, n),
            }
        )
