"""The real `specrag serve` process on loopback: HTTP requests (one streamed), concurrency, a client that
disconnects mid-stream, graceful shutdown that drains an in-flight request, and pages after each."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _idle(base: str) -> bool:
    engines = httpx.get(f"{base}/health").json()["engines"]
    return all(
        e["running_requests"] == 0 and e["queue_depth"] == 0 and e["pages_free"] + e["pages_cached"] == e["pages_total"]
        for e in engines.values()
    )


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specrag_jax.cli",
            "serve",
            "--port",
            str(port),
            "--drafter",
            "tiny:llama",
            "--verifier",
            "tiny:gemma3",
            "--num-pages",
            "128",
            "--max-seq-len",
            "512",
            "--m",
            "2",
            "--max-running",
            "16",
            "--warmup",
            "decode",
            "--compile-cache",
            str(tmp_path / "xla"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: proc.poll() is not None or httpx.get(f"{base}/health").status_code == 200, 180, "the server")
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        log.close()


def test_real_server_streams_batches_cancels_and_drains(server):
    base, proc = server
    engines = httpx.get(f"{base}/health").json()["engines"]
    assert all(e["warmup_programs"] > 0 for e in engines.values())  # step shapes compiled before serving
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(8)]
    body = lambda p, n=8: {"prompt": p, "max_tokens": n}  # noqa: E731
    alone = [
        httpx.post(f"{base}/v1/completions", json=body(p), timeout=120).json()["choices"][0]["text"] for p in prompts
    ]
    with ThreadPoolExecutor(8) as pool:  # batch invariance over real HTTP
        together = list(
            pool.map(
                lambda p: httpx.post(f"{base}/v1/completions", json=body(p), timeout=120).json()["choices"][0]["text"],
                prompts,
            )
        )
    assert together == alone
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        timeout=120,
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": True},
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[1][6:])["object"] == "chat.completion.chunk"
    with httpx.stream("POST", f"{base}/v1/completions", timeout=120, json={**body(prompts[2]), "stream": True}) as r:
        streamed = "".join(
            json.loads(line[6:])["choices"][0]["text"] for line in r.iter_lines() if line.startswith("data: {")
        )
    assert streamed == alone[2]  # incremental detokenization adds up to the whole text
    _wait(lambda: _idle(base), 30, "pages after the streamed request")

    # a client that goes away mid-stream cancels its request
    with httpx.stream(
        "POST",
        f"{base}/v1/completions",
        timeout=120,
        json={"prompt": "Tell a long story", "max_tokens": 400, "stream": True},
    ) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))
    _wait(lambda: _idle(base), 30, "the disconnected request's pages")
    stats = httpx.get(f"{base}/health").json()["engines"]["drafter"]
    assert stats.get("cancelled", 0) >= 1 and stats["generated_tokens"] < 8 * 8 * 2 + 6 + 400

    # a non-streamed request whose client gives up: cancelled server-side (or finished), pages return either way
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{base}/v1/rag",
            json={"question": "Why is the sky blue?", "documents": ["Light scatters."] * 4},
            timeout=0.3,
        )
    _wait(lambda: _idle(base), 60, "the abandoned request's pages")

    # graceful shutdown: SIGTERM while a streamed request runs; it still completes, then the process exits 0
    with httpx.stream(
        "POST",
        f"{base}/v1/completions",
        timeout=120,
        json={"prompt": "Count slowly", "max_tokens": 300, "stream": True},
    ) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")
    assert proc.wait(60) == 0
