"""Server-sent events and the asyncio plumbing between HTTP handlers and engine futures (shared by the OpenAI
endpoints and /v1/rag)."""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator


def sse(data) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


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
