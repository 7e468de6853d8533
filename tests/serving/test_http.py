"""HTTP app in process: OpenAI-compatible endpoints, /v1/rag, errors, metrics, and pages after each."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from specrag_jax.serving.app import create_app
from tests.serving.conftest import DOCS, assert_pages_home


def pages_home(svc) -> None:
    for eng in svc.unique_engines.values():
        assert_pages_home(eng)


@pytest.fixture
def client(make_service):
    svc = make_service()
    with TestClient(create_app(svc)) as c:
        c.service = svc
        yield c


def _events(text: str) -> list:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_completions_and_chat_json_and_streamed(client):
    r = client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] <= 5
    text = body["choices"][0]["text"]
    r = client.post("/v1/completions", json={"prompt": ["Hello there", "Hi"], "max_tokens": 5})
    assert [c["index"] for c in r.json()["choices"]] == [0, 1] and r.json()["choices"][0]["text"] == text
    with client.stream("POST", "/v1/completions", json={"prompt": "Hello there", "max_tokens": 5, "stream": True}) as s:
        events = _events(s.read().decode())
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == text
    r = client.post(
        "/v1/chat/completions",
        json={"model": "verifier", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
    ) as s:
        events = _events(s.read().decode())
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    pages_home(client.service)


def test_rag_contract_with_documents_corpus_and_stream(client):
    body = {"question": "What is the capital of France?", "documents": DOCS, "m": 2, "k": 2, "method": "speculative"}
    r = client.post("/v1/rag", json=body)
    assert r.status_code == 200, r.text
    body = r.json()
    assert {"answer", "rationale", "citations", "drafts", "trace"} <= set(body)
    assert len(body["drafts"]) == 2 and all("score" in d for d in body["drafts"])
    assert set(body["citations"]) <= {d["id"] for d in DOCS}
    assert "drafting_s" in body["trace"]
    r = client.post(
        "/v1/rag",
        json={
            "question": "What is the capital of France?",
            "documents": DOCS,
            "m": 2,
            "selection": "evidence+agg",
            "tau_min": 1.0,
            "method": "speculative",
        },
    )
    assert r.status_code == 200, r.text
    trace = r.json()["trace"]
    assert trace["selection"] == "evidence+agg" or trace.get("consensus")
    # verified, or the fallback was certain before verification (early fallback), or the consensus fast path
    assert "evidence_verification_s" in trace or "confidence_bound" in trace or trace.get("consensus")
    assert trace.get("path") in ("fallback", "consensus")  # no draft clears tau_min 1.0
    r = client.post(
        "/v1/rag",
        json={
            "question": "capital of Italy",
            "method": "standard",
            "documents": ["Rome is the capital of Italy.", "Oslo is in Norway."],
        },
    )
    assert r.status_code == 200 and r.json()["citations"] == ["0", "1"]
    r = client.post("/v1/rag", json={"question": "capital of Germany", "method": "drafter_only"})  # corpus search
    assert r.status_code == 200 and r.json()["drafts"]
    docs = ["Rome is the capital of Italy.", "Oslo is in Norway."]
    standard = client.post("/v1/rag", json={"question": "capital of Italy", "method": "standard", "documents": docs})
    lossless = client.post("/v1/rag", json={"question": "capital of Italy", "method": "lossless", "documents": docs})
    assert lossless.status_code == 200, lossless.text
    assert lossless.json()["answer"] == standard.json()["answer"]
    assert lossless.json()["trace"]["speculation"]["steps"] >= 1
    stream = {"question": "capital of Germany", "stream": True, "m": 2, "method": "speculative"}
    with client.stream("POST", "/v1/rag", json=stream) as s:
        events = [json.loads(e) for e in _events(s.read().decode()) if e != "[DONE]"]
    stages = [e["stage"] for e in events if e["event"] == "stage"]
    assert stages[0] == "retrieval" and "drafter_generate" in stages
    assert events[-1]["event"] == "result" and "answer" in events[-1]
    routed = client.post("/v1/rag", json={"question": "capital of Italy", "documents": docs})  # the default: auto
    assert routed.status_code == 200, routed.text
    assert routed.json()["method"] == "auto" and routed.json()["trace"]["route"]["path"] in ("exact", "cascade")
    pages_home(client.service)


@pytest.mark.parametrize(
    "payload, status, message",
    [
        (b"{not json", 400, "malformed JSON"),
        (json.dumps({"prompt": "hi", "bogus": 1}).encode(), 400, "bogus"),
        (json.dumps({"prompt": "hi", "temperature": -1}).encode(), 400, "temperature"),
        (json.dumps({"prompt": "hi", "n": 17}).encode(), 400, "n"),
        (json.dumps({"prompt": "hi", "model": "gpt-9"}).encode(), 400, "unknown model"),
        (json.dumps({"prompt": "x" * 5000, "max_tokens": 10}).encode(), 400, "too long"),
        (json.dumps({"prompt": []}).encode(), 400, "prompt"),
        (json.dumps({"prompt": "x" * 1_100_000}).encode(), 413, "body"),
    ],
)
def test_bad_requests(client, payload, status, message):
    r = client.post("/v1/completions", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    pages_home(client.service)


def test_rag_bad_requests(client):
    for body, message in [
        ({"question": ""}, "question"),
        ({"question": "q", "method": "oracle"}, "method"),
        ({"question": "q", "m": 0}, "m"),
        ({"question": "q", "documents": [{"text": "x"}]}, "id"),
        ({"question": "q", "selection": "vote"}, "selection"),
        ({"question": "q", "tau_min": 1.5}, "tau_min"),
    ]:
        r = client.post("/v1/rag", json=body)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    pages_home(client.service)


def test_api_key_busy_timeout_and_metrics(make_service):
    svc = make_service(api_key="sekret", max_inflight=1, max_waiting=0, request_timeout=0.05)
    with TestClient(create_app(svc)) as c:
        body = {"prompt": "Hello", "max_tokens": 4}
        assert c.post("/v1/completions", json=body).status_code == 401
        assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        auth = {"Authorization": "Bearer sekret"}
        assert svc.try_enter()  # occupy the only slot
        r = c.post("/v1/completions", json=body, headers=auth)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        svc.leave()
        slow = {"question": "capital of France?", "documents": DOCS, "method": "speculative"}  # drafts: over 0.05 s
        r = c.post("/v1/rag", json=slow, headers=auth)
        assert r.status_code == 504, r.text
        assert c.get("/health").json()["status"] == "ok"
        metrics = c.get("/metrics").text
        for name in (
            "specrag_kv_pages_free",
            "specrag_kv_pages_cached",
            "specrag_kv_pages_total",
            "specrag_queue_depth",
            "specrag_running_sequences",
            "specrag_prefix_cache_hit_rate",
            "specrag_tokens_per_second",
        ):
            assert f'{name}{{engine="drafter"}}' in metrics and f'{name}{{engine="verifier"}}' in metrics, name
        assert "# TYPE specrag_stage_seconds histogram" in metrics
        assert "# TYPE specrag_engine_stage_seconds histogram" in metrics
        pages_home(svc)  # the cancelled engine work is reaped on the engine's next step
        assert c.post("/reset_prefix_cache").status_code == 401
        r = c.post("/reset_prefix_cache", headers=auth)
        assert r.status_code == 200 and set(r.json()["freed_pages"]) == {"drafter", "verifier"}
        assert all(
            e["pages_cached"] == 0 and e["pages_free"] == e["pages_total"]
            for e in c.get("/health").json()["engines"].values()
        )
