"""The HTTP app (FastAPI): OpenAI-compatible models and completions, /v1/rag, /health and /metrics.

Errors are JSON ``{"error": {"message", "type"}}``: 400 malformed JSON / unknown fields / invalid or
unsupported parameters, 401 missing or wrong API key (when one is set), 404 unknown model id on
/v1/models/{id}, 413 oversized body, 429 + Retry-After when too busy, 504 past the per-request timeout.
A client that disconnects mid-stream cancels its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from typing import Annotated

from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specrag_jax.errors import SpecRagError
from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.requests import EngineError, EngineStopped, QueueFull, RequestCancelled, RequestTimeout
from specrag_jax.serving.metrics import Metrics
from specrag_jax.serving.openai_api import OpenAIHandlers
from specrag_jax.serving.rag_openapi import RAG_RESPONSES, REQUEST_EXAMPLES
from specrag_jax.serving.rag_schemas import RagRequest
from specrag_jax.serving.schemas import ChatCompletionRequest, CompletionRequest
from specrag_jax.serving.service import Service
from specrag_jax.serving.sse import abandon, queued_until_done, sse, until_done_or_gone

log = logging.getLogger(__name__)


def _error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)


class _TooLarge(HTTPException):
    def __init__(self) -> None:
        super().__init__(413, "request body too large")


class BodyLimit:
    """Refuse bodies over ``limit`` bytes (declared or streamed) with 413."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _error(413, f"request body over {self.limit} bytes", "request_too_large")(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return message

        await self.app(scope, limited, send)


def create_app(service: Service, *, metrics: Metrics | None = None) -> FastAPI:
    """The app around a (not yet started) service; the app's lifespan starts it and drains it on shutdown."""
    metrics = metrics or Metrics(lambda: service.unique_engines)
    for eng in service.unique_engines.values():
        eng.on_stage = metrics.on_engine_stage

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        service.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, service.stop, True)

    app = FastAPI(title="specrag-jax", version="0.1", lifespan=lifespan)
    app.state.service, app.state.metrics = service, metrics
    app.add_middleware(BodyLimit, limit=service.config.max_body_bytes)
    openai = OpenAIHandlers(service)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = "malformed JSON body"
        return _error(400, f"{where}: {msg}" if where else msg, "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, exc: StarletteHTTPException):
        return _error(
            exc.status_code,
            str(exc.detail),
            "invalid_request_error" if exc.status_code < 500 else "server_error",
            getattr(exc, "headers", None),
        )

    @app.exception_handler(SpecRagError)
    async def _domain(_req, exc: SpecRagError):
        if isinstance(exc, QueueFull):
            return _error(429, str(exc), "rate_limit_error", {"Retry-After": "1"})
        if isinstance(exc, RequestTimeout):
            return _error(504, str(exc), "timeout")
        if isinstance(exc, EngineStopped):
            return _error(503, str(exc), "unavailable", {"Retry-After": "5"})
        if isinstance(exc, RequestCancelled):
            return _error(499, str(exc), "cancelled")
        if type(exc) is EngineError:  # a failed engine step: our fault, not the client's
            return _error(500, str(exc), "server_error")
        return _error(400, str(exc), "invalid_request_error")

    @app.middleware("http")
    async def _count(request: Request, call_next):
        response = await call_next(request)
        metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        return response

    async def auth(request: Request) -> None:
        key = service.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise HTTPException(401, "missing or wrong API key", headers={"WWW-Authenticate": "Bearer"})

    async def slot(request: Request):
        if not service.try_enter():
            raise HTTPException(429, "server busy: too many requests in flight", headers={"Retry-After": "1"})
        try:
            yield
        finally:
            service.leave()

    guarded = [Depends(auth), Depends(slot)]

    @app.get("/health")
    async def health():
        return {"status": "ok", "engines": {n: e.stats() for n, e in service.unique_engines.items()}}

    @app.post("/reset_prefix_cache", dependencies=[Depends(auth)])
    async def reset_prefix_cache():
        """Evict the prefix caches' evictable pages (pages of running requests stay); for cold-cache benchmarks."""
        return {"freed_pages": {n: e.reset_prefix_cache() for n, e in service.unique_engines.items()}}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models():
        return openai.models()

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(auth)])
    async def model(model_id: str):
        return openai.model(model_id)

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(body: CompletionRequest, request: Request):
        return await openai.completions(body, request)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await openai.completions(body, request, chat=True)

    @app.post("/v1/rag", dependencies=guarded, responses=RAG_RESPONSES)
    async def rag(body: Annotated[RagRequest, Body(openapi_examples=REQUEST_EXAMPLES)], request: Request):
        """Answer a question with Speculative RAG (or a baseline ``method``) over the given passages or the
        server's corpus: the answer, its rationale, the cited documents, every draft's scores and the trace."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        on_event = (lambda e: loop.call_soon_threadsafe(queue.put_nowait, e)) if body.stream else None
        ctx = RequestContext(service.config.request_timeout, on_event)
        docs = (
            None
            if body.documents is None
            else [d if isinstance(d, str) else {**d.model_dump(), "id": str(d.id)} for d in body.documents]
        )
        future = asyncio.wrap_future(
            service.submit(service.rag, body.question, docs, body.method, ctx, **body.rag_options())
        )
        if not body.stream:
            try:
                answer = await until_done_or_gone(request, future, ctx.cancel)
            finally:
                if not future.done():
                    ctx.cancel()
                abandon(future)
            metrics.observe_trace(answer.trace)
            return answer.to_dict()
        return StreamingResponse(
            _rag_stream(future, queue, ctx, metrics),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    return app


async def _rag_stream(future, queue: asyncio.Queue, ctx: RequestContext, metrics: Metrics):
    try:
        yield sse({"event": "stage", "stage": "retrieval"})
        async for event in queued_until_done(queue, future):
            yield sse(event)
        while not queue.empty():
            yield sse(queue.get_nowait())
        try:
            answer = await future
        except Exception as exc:
            yield sse({"event": "error", "message": str(exc), "type": type(exc).__name__})
            return
        metrics.observe_trace(answer.trace)
        yield sse(json.dumps({"event": "result", **answer.to_dict()}))
        yield sse("[DONE]")
    finally:
        if not future.done():
            ctx.cancel()  # client gone mid-stream: the pipeline's engine work is cancelled, its pages return
            log.info("rag request cancelled by the client")
        abandon(future)
