"""Qwen2.5's byte-level BPE tokenizer (GGUF pre-type "qwen2") against transformers, on the real model file."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings

from specrag_jax.models.tokenizer.load import load_tokenizer
from tests.models.tokenizer.test_tokenizer import CONVERSATIONS, TRICKY, check_parity, hf_pair, random_text

pytestmark = pytest.mark.slow
QWEN = "qwen2.5-coder-1.5b-instruct"


@pytest.fixture(scope="module")
def qwen():
    from tokenizers import Tokenizer, normalizers

    ours, hf = hf_pair(QWEN)
    # transformers' GGUF conversion gives qwen2 files Qwen2's split regex and byte-level step but not the NFC
    # normalizer that Qwen2's tokenizer.json (transformers' own Qwen2Tokenizer) runs first. We follow the real
    # tokenizer, so the reference is transformers' converted vocabulary, merges and added tokens with NFC
    # restored; test_nfc_divergence pins the difference.
    reference = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    reference.normalizer = normalizers.NFC()
    return (
        ours,
        hf,
        lambda text: reference.encode(text, add_special_tokens=False).ids,
        lambda text: unicodedata.normalize("NFC", text),
    )


@pytest.mark.parametrize("text", TRICKY)
def test_qwen_parity(qwen, text):
    check_parity(qwen, text)


@settings(max_examples=50, deadline=None)
@given(text=random_text(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|fim_prefix|>", "<|repo_name|>"]))
def test_qwen_random_text(qwen, text):
    check_parity(qwen, text)


def test_qwen_special_ids_and_digits(qwen):
    ours, hf = qwen[0], qwen[1]
    assert ours.vocab_size == len(hf)
    assert (ours.bos_id, ours.pad_id, ours.add_bos_default) == (hf.bos_token_id, hf.pad_token_id, False)
    assert ours.token_to_id("<|im_end|>") in ours.eos_ids and ours.token_to_id("<|endoftext|>") in ours.eos_ids
    assert [ours.id_to_token(i) for i in ours.encode("x 2024")] == ["x", "Ġ", "2", "0", "2", "4"]


def test_nfc_divergence(qwen):
    ours, hf = qwen[0], qwen[1]
    text = "cafe\u0301"  # decomposed e + combining acute: NFC composes it to U+00E9 first
    assert ours.encode(text) == ours.encode("caf\u00e9") != hf.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_qwen_chat_template(qwen, messages, add_generation_prompt):
    ours, hf = qwen[0], qwen[1]
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    if messages[0]["role"] != "system":  # ChatML with Qwen's default system turn
        assert expected.startswith("<|im_start|>system\nYou are Qwen")


def test_by_name_and_path_share_one_object():
    from specrag_jax.models.loading.registry import resolve_model_path

    assert load_tokenizer(QWEN) is load_tokenizer(str(resolve_model_path(QWEN).resolve()))
