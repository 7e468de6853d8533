"""Log-probabilities in OpenAI's response shapes, from what the engine returns per token.

The numbers are the sampler's (``models.sampling.sampler``): the log-softmax of the penalised logits, before
temperature / top-k / top-p; under speculation the verifier's own at the row that emitted each token. A
token's text is its own decode (``bytes``: its UTF-8, as OpenAI sends; a piece of a multi-byte character
shows as U+FFFD there, as in vLLM).
"""

from __future__ import annotations

from typing import Callable, Sequence

from specrag_jax.models.engine.requests import TopLogprobs

Decode = Callable[[Sequence[int]], str]


def _entry(decode: Decode, token: int, logprob: float) -> dict:
    text = decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    decode: Decode, ids: Sequence[int], logprobs: Sequence[float], tops: Sequence[TopLogprobs] | None
) -> dict:
    """A chat choice's (or chunk's) ``logprobs``: ``{"content": [...], "refusal": None}``."""
    content = []
    for k, (tok, lp) in enumerate(zip(ids, logprobs)):
        alts = [] if not tops else [_entry(decode, i, v) for i, v in zip(*tops[k])]
        content.append({**_entry(decode, tok, lp), "top_logprobs": alts})
    return {"content": content, "refusal": None}


def completion_logprobs(
    decode: Decode, ids: Sequence[int], logprobs: Sequence[float], tops: Sequence[TopLogprobs] | None, offset: int = 0
) -> dict:
    """A completion choice's (or chunk's) ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset
    (``offset``: characters of the choice's text before these tokens)."""
    tokens = [decode([t]) for t in ids]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    top = None if tops is None else [{decode([i]): v for i, v in zip(*tops[k])} for k in range(len(ids))]
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": top, "text_offset": offsets}


def tokens_for_text(decode: Decode, ids: Sequence[int], text: str) -> int:
    """How many of ``ids`` it takes to produce ``text`` (a prefix of their decode; a stop string cut the rest):
    the logprobs reported with a cut text end with the token that completes it."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) >= len(text):
            hi = mid
        else:
            lo = mid + 1
    return lo
