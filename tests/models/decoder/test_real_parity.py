"""Logit and greedy parity with transformers on the real GGUF models (float32, same file)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specrag_jax.models.generation import greedy_generate  # noqa: E402
from specrag_jax.models.text_model import TextModel  # noqa: E402

pytestmark = pytest.mark.slow


def long_prompt_text() -> str:
    """Deterministic English text of well over 600 tokens, from the CPython docs shipped with Python."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in ("assert", "break", "continue", "pass", "del", "return", "if", "while"))


def logits_at_rows(model: TextModel, ids: list[int], rows: list[int]) -> np.ndarray:
    """Our float32 logits at ``rows`` of one prefill of ``ids`` (pages returned afterwards)."""
    from specrag_jax.models.executor.runner import Chunk

    runner = model.runner
    pages = runner.allocator.allocate(-(-len(ids) // runner.page_size))
    try:
        return runner.logits(runner.pack([Chunk(pages, 0, ids, rows=rows)]))
    finally:
        runner.allocator.release(pages)


@pytest.fixture(scope="module", params=["gemma3-270m", "smollm2-135m-instruct"])
def pair(request, hf_reference):
    ours = TextModel.load(request.param, max_seq_len=1024, max_batch=1)
    yield ours, hf_reference(request.param)
    del ours
    gc.collect()


def test_logits_match_over_a_long_prompt(pair):
    ours, theirs = pair
    ids = ours.tokenizer.encode(long_prompt_text(), add_bos=ours.tokenizer.add_bos_default)[:700]
    assert len(ids) >= 600
    # Positions on both sides of Gemma's 512-token sliding window, plus the whole tail.
    rows = sorted(set(range(0, len(ids), 37)) | set(range(len(ids) - 24, len(ids))))
    mine = logits_at_rows(ours, ids, rows)
    with torch.no_grad():
        ref = theirs(torch.tensor([ids])).logits[0, rows].float().numpy()
    diff = np.abs(mine - ref).max()
    print(f"max |logit diff| over {len(rows)} positions x {ref.shape[1]} vocab: {diff:.2e}")
    assert diff <= 1e-3


def test_greedy_continuation_matches(pair):
    ours, theirs = pair
    prompt = "The capital of France is Paris. The capital of Germany is"
    ids = ours.tokenizer.encode(prompt, add_bos=ours.tokenizer.add_bos_default)
    mine = greedy_generate(ours.runner, [ids], 32)[0]
    with torch.no_grad():
        out = theirs.generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ref = out[0, len(ids) :].tolist()
    assert len(ref) == 32
    assert mine == ref
