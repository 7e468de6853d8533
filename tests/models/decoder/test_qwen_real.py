"""Qwen2.5-Coder-1.5B-Instruct (GGUF from the 22 PyPI part packages): parity with transformers, float32.

Memory: both models in float32 are 6.2 GB each, so transformers' outputs are computed first and its
model is freed before ours loads (peak about one model plus the conversion)."""

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
QWEN = "qwen2.5-coder-1.5b-instruct"
GREEDY_PROMPT = "The capital of France is Paris. The capital of Germany is"


@pytest.fixture(scope="module")
def qwen():
    """(our TextModel, prompt ids, rows, transformers' logits at rows, transformers' greedy 32 tokens)."""
    from specrag_jax.models.tokenizer.load import load_tokenizer
    from tests.hf_gguf import transformers_gguf_model

    tok = load_tokenizer(QWEN)
    ids = tok.encode(long_prompt_text())[:720]
    rows = sorted(set(range(0, len(ids), 37)) | set(range(len(ids) - 16, len(ids))))
    greedy_ids = tok.encode(GREEDY_PROMPT)
    theirs = transformers_gguf_model(QWEN)  # transformers' GGUF loader with our bit-exact dequantiser
    with torch.no_grad():
        ref_logits = theirs(torch.tensor([ids])).logits[0, rows].float().numpy()
        out = theirs.generate(
            torch.tensor([greedy_ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ref_greedy = out[0, len(greedy_ids) :].tolist()
    del theirs, out
    gc.collect()
    ours = TextModel.load(QWEN, max_seq_len=1024, max_batch=1)
    yield ours, ids, rows, ref_logits, greedy_ids, ref_greedy
    del ours
    gc.collect()


def test_config_from_gguf(qwen):
    cfg = qwen[0].runner.cfg
    assert (cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        "qwen2",
        1536,
        28,
        12,
        2,
        128,
    )
    assert cfg.attention_bias and not cfg.tie_embeddings and cfg.rope_theta == 1e6  # output.weight is in the file
    assert qwen[0].instruct and qwen[0].tokenizer.chat_template


def test_logits_match_over_a_long_prompt(qwen):
    ours, ids, rows, ref, _, _ = qwen
    assert len(ids) >= 700
    mine = logits_at_rows(ours, ids, rows)
    diff = np.abs(mine - ref).max()
    print(f"qwen2.5-coder-1.5b: max |logit diff| over {len(rows)} positions x {ref.shape[1]} vocab: {diff:.2e}")
    assert diff <= 1e-3


def test_greedy_continuation_matches(qwen):
    ours, _, _, _, greedy_ids, ref = qwen
    assert len(ref) == 32
    assert greedy_generate(ours.runner, [greedy_ids], 32)[0] == ref
