"""A client that disconnects mid-stream: its request is cancelled quietly (no asyncio "Future exception was
never retrieved", no ERROR record, at most one line about the cancellation) and its pages return to the pool.

The app runs under a real uvicorn server (in a thread of this process, so ``caplog`` sees the server's log
records, asyncio's included) and the client is httpx, closing the connection after the first events.
"""

from __future__ import annotations

import gc
import json
import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from specrag_jax.serving.app import create_app
from tests.serving.conftest import DOCS, assert_pages_home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live(make_service, monkeypatch):
    """(base url, service, stop()): the app on a uvicorn server in a background thread; shut down after the test.

    Every engine step is slowed by 20 ms, so a 400-token stream lasts 8 s and the client surely leaves
    mid-stream (warm, the tiny model writes 400 tokens in ~0.1 s). At 4 ms (1.6 s), one of three streams finished
    before the server saw the disconnect while another test process shared the two cores (`make test`'s
    two workers)."""
    svc = make_service(request_timeout=60.0)
    for eng in svc.unique_engines.values():
        step = eng._iteration

        def slowed(step=step):
            time.sleep(0.02)
            step()

        monkeypatch.setattr(eng, "_iteration", slowed)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(svc),
            host="127.0.0.1",
            port=port,
            log_config=None,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=10,
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not shut down"

    try:
        yield f"http://127.0.0.1:{port}", svc, stop
    finally:
        stop()


def _disconnect_after(base: str, path: str, body: dict, wanted) -> None:
    """POST a streamed request, read events until ``wanted(event)`` holds, then drop the connection."""
    with httpx.stream("POST", base + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and wanted(line[6:]):
                break
        else:
            pytest.fail("the stream ended before the client could disconnect mid-stream")


def _first_text(event: str) -> bool:
    c = json.loads(event)["choices"][0]
    return bool(c.get("text") or c.get("delta", {}).get("content"))


CASES = {
    "completions": (
        "/v1/completions",
        {"prompt": "Tell a long story", "max_tokens": 400, "stream": True},
        _first_text,
        "drafter",
    ),
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Tell a long story"}], "max_tokens": 400, "stream": True},
        _first_text,
        "drafter",
    ),
    "rag": (
        "/v1/rag",
        {"question": "What is the capital of France?", "documents": DOCS, "stream": True, "method": "speculative"},
        lambda e: json.loads(e).get("stage") == "drafter_generate",
        None,
    ),  # may stop before its engine work
}


@pytest.mark.parametrize("case", list(CASES))
def test_client_disconnect_mid_stream_is_quiet_and_frees_pages(live, caplog, case):
    base, svc, stop = live
    path, body, wanted, role = CASES[case]
    caplog.set_level(logging.INFO)
    engine = svc.engines[role or "drafter"]
    before = engine.stats().get("cancelled", 0)
    for _ in range(3):  # several disconnects: every one used to leave a never-retrieved RequestCancelled
        _disconnect_after(base, path, body, wanted)
    for eng in svc.unique_engines.values():
        assert_pages_home(eng, wait=30)
    if role is not None:  # the engine work really was cancelled, not finished
        assert engine.stats().get("cancelled", 0) >= before + 3
    # the app keeps serving after the disconnects
    r = httpx.post(base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200, r.text
    time.sleep(0.3)  # let the server's loop run the callbacks the engine thread scheduled
    gc.collect()  # asyncio logs a never-retrieved exception when the Future is collected
    stop()  # the server's loop closes (asyncio also reports still-pending tasks then)
    gc.collect()
    for eng in svc.unique_engines.values():
        assert_pages_home(eng)

    def text(rec: logging.LogRecord) -> str:
        return rec.getMessage() + (logging.Formatter().formatException(rec.exc_info) if rec.exc_info else "")

    records = [(rec.name, rec.levelname, text(rec)) for rec in caplog.records]
    assert not [r for r in records if "never retrieved" in r[2] or "destroyed but it is pending" in r[2]], records
    assert not [r for r in records if r[1] in ("ERROR", "CRITICAL")], records
    mentions = [r for r in records if "cancel" in r[2].lower()]
    assert len(mentions) <= 3, mentions  # at most one line per cancelled request
    assert all("Traceback" not in r[2] for r in mentions), mentions
