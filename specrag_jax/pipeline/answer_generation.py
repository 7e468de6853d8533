"""The verifier's own answer (standard RAG, closed book, the exact path, the cascade's fallback): one generation
whose form follows ``RAGConfig.answer_stop`` ("turn": the reply up to end of turn, the budget a cap within the
context's room; "line": its first line), optionally streamed and decoded with speculation."""

from __future__ import annotations

import time

from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation
from specrag_jax.models.text_model import TextModel
from specrag_jax.pipeline.answer_stream import AnswerStream
from specrag_jax.pipeline.closed_set import ClosedSet
from specrag_jax.pipeline.lossless import speculation_trace
from specrag_jax.pipeline.prompts import first_line
from specrag_jax.pipeline.rag_config import RAGConfig


def one_line(config: RAGConfig, closed: ClosedSet | None = None) -> bool:
    """Whether the answer is its first line: the paper's form, or a closed set's label."""
    return config.answer_stop == "line" or closed is not None


def generate_answer(
    verifier: TextModel,
    config: RAGConfig,
    prompt: str,
    trace: dict,
    speculation: Speculation | None = None,
    closed: ClosedSet | None = None,
    stream: AnswerStream | None = None,
) -> str:
    """The answer to the rendered ``prompt``; its counts and times go into ``trace`` (``answer_cut``: the budget
    ended it). ``closed``: one line, parsed to the label it gives (its first line when it gives none)."""
    t = time.perf_counter()
    line = one_line(config, closed)
    ids = verifier.tokenizer.encode_rendered(prompt)
    budget = config.max_answer_tokens
    if not line:  # a cap, not a length: the answer gets the context's room when that is less
        budget = max(min(budget, verifier.runner.max_seq_len - len(ids)), 1)
    [res] = verifier.generate_ids(
        [ids],
        SamplingParams(),
        budget,
        stop=["\n"] if line else (),  # "turn": up to the verifier's end of turn (its EOS ids)
        speculation=speculation,
        on_text=None if stream is None else stream.push,
    )
    trace.update(
        generation_s=time.perf_counter() - t,
        verifier_prefill_tokens=res.num_prompt_tokens,
        verifier_decode_tokens=len(res.token_ids),
        verifier_decode_s=res.decode_s,
        verifier_prefill_compile_s=res.prefill_compile_s,  # one-time XLA work inside the generation's phases
        verifier_decode_compile_s=res.decode_compile_s,
        answer_cut=res.finish_reason == "length",  # the budget ended it, not the model (nor the line)
    )
    if speculation is not None:
        trace["speculation"] = speculation_trace(res.speculation)
    text = first_line(res.text) if line else res.text.strip()
    return text if closed is None else closed.parse(text) or text
