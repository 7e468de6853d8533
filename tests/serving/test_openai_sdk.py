"""The OpenAI-compatible endpoints as the official ``openai`` SDK calls them: a uvicorn server on loopback
(tiny models, an API key), models, completions, chat (plain, content parts, no-op fields, streamed usage),
logprobs, penalties, seeds, n choices (streamed too), a stream the client closes, auth, and a one-line 400
naming each field the server does not honour."""

from __future__ import annotations

import socket
import threading
import time

import openai
import pytest
import uvicorn

from specrag_jax.serving.app import create_app
from specrag_jax.serving.service import ServeConfig, Service
from specrag_jax.serving.tiny import tiny_text_model
from tests.serving.conftest import assert_pages_home

KEY = "sekret"
HI = [{"role": "user", "content": "Hi"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """(base URL, service): the app served by uvicorn in a thread on 127.0.0.1."""
    drafter = tiny_text_model("tiny:llama", seed=7, num_pages=96, page_size=16, max_seq_len=256)
    verifier = tiny_text_model("tiny:gemma3", seed=8, num_pages=96, page_size=16, max_seq_len=256)
    svc = Service(drafter, verifier, config=ServeConfig(api_key=KEY, request_timeout=60))
    port = _free_port()
    uv = uvicorn.Server(uvicorn.Config(create_app(svc), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not uv.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uv.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}/v1", svc
    finally:
        uv.should_exit = True
        thread.join(60)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0], api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture
def pages_home(server):
    yield
    for eng in server[1].unique_engines.values():
        assert_pages_home(eng)


def test_models_list_and_retrieve(client):
    ids = [m.id for m in client.models.list()]
    assert set(ids) == {"default", "drafter", "verifier", "tiny:llama", "tiny:gemma3"}
    card = client.models.retrieve("tiny:gemma3")
    assert (card.id, card.object, card.owned_by) == ("tiny:gemma3", "model", "specrag-jax") and card.created > 0
    assert client.models.retrieve("verifier").id == "verifier"
    with pytest.raises(openai.NotFoundError, match="gpt-9"):
        client.models.retrieve("gpt-9")


def test_completions(client, pages_home):
    r = client.completions.create(model="drafter", prompt="Hello there", max_tokens=5)
    assert r.object == "text_completion" and r.model == "tiny:llama" and len(r.choices) == 1
    assert r.choices[0].finish_reason in ("stop", "length") and 0 < r.usage.completion_tokens <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(
        client.completions.create(
            model="drafter", prompt="Hello there", max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_plain_and_accepted_fields(client, pages_home):
    r = client.chat.completions.create(model="verifier", messages=HI, max_tokens=4)
    assert r.object == "chat.completion" and r.model == "tiny:gemma3"
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 4
    same = [
        dict(max_completion_tokens=4),
        dict(max_tokens=4, max_completion_tokens=4),
        dict(max_tokens=4, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]),
        dict(max_tokens=4, response_format={"type": "text"}, tools=[], tool_choice="none"),
        dict(
            max_tokens=4,
            user="u1",
            metadata={"k": "v"},
            store=False,
            parallel_tool_calls=False,
            service_tier="auto",
            modalities=["text"],
            n=1,
            logprobs=False,
            frequency_penalty=0,
            temperature=None,
        ),
    ]
    for kwargs in same:
        got = client.chat.completions.create(**{"model": "verifier", "messages": HI, **kwargs})
        assert got.choices[0].message.content == text, kwargs
    parts = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Hi"}]
    r = client.chat.completions.create(
        model="drafter",
        max_tokens=3,
        messages=[{"role": "system", "content": parts[:1]}, {"role": "user", "content": parts[1:]}],
    )
    assert r.usage.completion_tokens <= 3


def test_chat_stream_with_usage(client, pages_home):
    whole = client.chat.completions.create(model="drafter", messages=HI, max_tokens=6)
    chunks = list(
        client.chat.completions.create(
            model="drafter", messages=HI, max_completion_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    last = chunks[-1]
    assert last.object == "chat.completion.chunk" and last.choices == [] and last.id == chunks[0].id
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.chat.completions.create(model="drafter", messages=HI, max_tokens=6, stream=True))
    assert plain[-1].choices and all(c.usage is None for c in plain)  # no usage chunk unless asked


def test_api_key(server):
    wrong = openai.OpenAI(base_url=server[0], api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="drafter", messages=HI, max_tokens=2)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("tools", dict(tools=[TOOL])),
        ("tool_choice", dict(tool_choice="required")),
        ("functions", dict(functions=[TOOL["function"]])),
        ("audio", dict(audio={"voice": "alloy", "format": "wav"}, modalities=["text", "audio"])),
        ("modalities", dict(modalities=["text", "audio"])),
        ("json_object", dict(response_format={"type": "json_object"})),
        ("json_schema", dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})),
        (
            "image_url",
            dict(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                        ],
                    }
                ]
            ),
        ),
        (
            "input_audio",
            dict(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}],
                    }
                ]
            ),
        ),
        ("top_logprobs", dict(top_logprobs=2)),
        ("top_logprobs", dict(logprobs=True, top_logprobs=21)),
        ("frequency_penalty", dict(frequency_penalty=2.5)),
        ("repetition_penalty", dict(extra_body={"repetition_penalty": 0})),
        ("logit_bias", dict(logit_bias={"50": 10})),
        ("n", dict(n=17)),
        ("max_completion_tokens", dict(max_tokens=4, max_completion_tokens=5)),
        ("stream_options", dict(stream_options={"include_usage": True})),
    ],
)
def test_chat_refuses_what_it_cannot_honour(client, field, kwargs):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{"model": "drafter", "messages": HI, "max_tokens": 2, **kwargs})
    message = err.value.body["message"]
    assert field in message and "\n" not in message and len(message) < 200, message
    if field == "logit_bias":
        assert "not supported yet" in message
    elif field not in (
        "max_completion_tokens",
        "stream_options",
        "top_logprobs",
        "frequency_penalty",
        "repetition_penalty",
        "n",
    ):
        assert "unsupported" in message
    if field == "max_completion_tokens":
        assert "max_tokens" in message


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("echo", dict(echo=True)),
        ("best_of", dict(best_of=2)),
        ("suffix", dict(suffix="end")),
        ("logit_bias", dict(logit_bias={"50": 10})),
    ],
)
def test_completions_refuse_what_they_cannot_honour(client, field, kwargs):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**{"model": "drafter", "prompt": "Hi", "max_tokens": 2, **kwargs})
    message = err.value.body["message"]
    assert field in message and "not supported yet" in message and "\n" not in message, message


def test_chat_logprobs(client, pages_home):
    r = client.chat.completions.create(model="drafter", messages=HI, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert (
        len(content) == r.usage.completion_tokens and "".join(t.token for t in content) == r.choices[0].message.content
    )
    for t in content:  # greedy: the chosen token is the likeliest
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode())
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)
    bare = client.chat.completions.create(model="drafter", messages=HI, max_tokens=6, logprobs=True)
    assert [(t.token, t.logprob, t.top_logprobs) for t in bare.choices[0].logprobs.content] == [
        (t.token, t.logprob, []) for t in content
    ]
    assert client.chat.completions.create(model="drafter", messages=HI, max_tokens=6).choices[0].logprobs is None
    chunks = list(
        client.chat.completions.create(
            model="drafter", messages=HI, max_tokens=6, logprobs=True, top_logprobs=3, stream=True
        )
    )
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in streamed] == [
        (t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in content
    ]


def test_completion_logprobs(client, pages_home):
    r = client.completions.create(model="verifier", prompt="Hello", max_tokens=6, logprobs=2)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert "".join(lp.tokens) == text and len(lp.token_logprobs) == len(lp.tokens) == r.usage.completion_tokens
    assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(len(lp.tokens))]
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 2 and top[tok] == v and max(top.values()) == v  # greedy
    chunks = list(client.completions.create(model="verifier", prompt="Hello", max_tokens=6, logprobs=2, stream=True))
    got = [
        (t, v)
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t, v in zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs)
    ]
    assert got == list(zip(lp.tokens, lp.token_logprobs))


def test_penalties(client, pages_home):
    ask = dict(model="drafter", prompt="aaaa aaaa aaaa", max_tokens=12)
    plain = client.completions.create(**ask).choices[0].text
    changed = [
        client.completions.create(**ask, **kw).choices[0].text
        for kw in (
            dict(presence_penalty=2.0),
            dict(frequency_penalty=2.0),
            dict(extra_body={"repetition_penalty": 5.0}),
        )
    ]
    assert all(t != plain for t in changed), (plain, changed)
    chat = client.chat.completions.create(
        model="verifier",
        messages=HI,
        max_tokens=8,
        frequency_penalty=1.5,
        presence_penalty=0.5,
        extra_body={"repetition_penalty": 1.2},
    )
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_seed_and_n_choices(client, server, pages_home):
    ask = dict(model="drafter", prompt="Once upon a time", max_tokens=8, temperature=1.0, n=3)
    r = client.completions.create(**ask, seed=5)
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert [c.text for c in client.completions.create(**ask, seed=5).choices] == texts
    assert [c.text for c in client.completions.create(**ask, seed=6).choices] != texts
    one = client.completions.create(**{**ask, "n": 1}, seed=5)
    assert one.choices[0].text == texts[0] and r.usage.prompt_tokens == one.usage.prompt_tokens
    two = client.completions.create(**{**ask, "prompt": ["Once upon a time", "Hi"]}, seed=5)
    assert [c.index for c in two.choices] == list(range(6)) and [c.text for c in two.choices[:3]] == texts
    streamed = {i: "" for i in range(3)}
    for c in client.completions.create(**ask, seed=5, stream=True):
        for ch in c.choices:
            streamed[ch.index] += ch.text
    assert [streamed[i] for i in range(3)] == texts
    chat = client.chat.completions.create(model="drafter", messages=HI, max_tokens=5, temperature=1.0, n=2, seed=1)
    assert [c.index for c in chat.choices] == [0, 1]
    deltas = {0: "", 1: ""}
    for c in client.chat.completions.create(
        model="drafter", messages=HI, max_tokens=5, temperature=1.0, n=2, seed=1, stream=True
    ):
        for ch in c.choices:
            deltas[ch.index] += ch.delta.content or ""
    assert [deltas[0], deltas[1]] == [c.message.content for c in chat.choices]


def test_stream_closed_by_the_client(client, server, pages_home):
    stream = client.chat.completions.create(
        model="verifier", messages=HI, max_tokens=200, stream=True, logprobs=True, presence_penalty=1.0
    )
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    stream.close()  # the server cancels the work; pages_home checks that every page came back
