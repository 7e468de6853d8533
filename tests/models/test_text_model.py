"""TextModel on a real model: stop strings, chat prompts, batched text generation."""

from __future__ import annotations

import pytest

from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.text_model import TextModel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    return TextModel.load("smollm2-135m-instruct", max_seq_len=512, max_batch=4)


def test_stop_string_cuts_text_and_ends_generation(smol):
    prompt = "List three fruits, one per line."
    [full] = smol.generate([prompt], max_new_tokens=24, chat=True)
    assert "\n" in full.text, full.text
    [cut] = smol.generate([prompt], max_new_tokens=24, stop=["\n"], chat=True)
    assert cut.text == full.text[: full.text.index("\n")]
    assert cut.finish_reason == "stop"
    assert len(cut.token_ids) < len(full.token_ids)


def test_chat_prompt_starts_with_template_and_batch_matches_single(smol):
    ids = smol.encode_prompt("Hi", chat=True)
    assert smol.tokenizer.decode(ids, skip_special=False).startswith("<|im_start|>system")
    prompts = ["What is 2+2?", "Name a planet.", "Say hello in French."]
    batch = smol.generate(prompts, SamplingParams(), max_new_tokens=10, chat=True)
    single = [smol.generate([p], SamplingParams(), max_new_tokens=10, chat=True)[0] for p in prompts]
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    assert smol.runner.allocator.num_free == smol.runner.allocator.num_usable
