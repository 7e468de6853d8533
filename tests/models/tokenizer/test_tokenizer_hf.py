"""Tiny Hugging Face tokenizer folders built here: our ids equal transformers' ``tokenizer(text)["input_ids"]``.

Folders: a Llama-style Metaspace BPE whose tokenizer.json post-processor adds ``<s>`` (TemplateProcessing),
the same adding ``<s> ... </s>``, one with ``add_bos_token: false`` and no post-processor, a byte-level BPE
(GPT-2 / Qwen style, ByteLevel post-processor, no BOS) and SentencePiece-only folders. ``specrag generate``
on a tiny random Llama with the first tokenizer gives transformers' prompt length and greedy continuation.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

from specrag_jax.cli import main  # noqa: E402
from specrag_jax.models.tokenizer.load import load_tokenizer  # noqa: E402

CORPUS = [
    "The capital of France is Paris.",
    "Hello world, this is a tiny test of tokenizers 123 456.",
    "Speculative RAG drafts answers in parallel and verifies them with a larger model.",
    "Every character the texts use: \n é ü 漢 .",
] * 8
# Only characters of the corpus: transformers' LlamaTokenizer rebuilds the BPE without an unk token, so it
# drops a character the vocabulary lacks where tokenizer.json maps it to <unk> (real vocabularies byte-fall back).
TEXTS = ["The capital of France is", "hello  world\n123", "Paris</s> is <s>a test", " leading space", "é ü 漢"]


def metaspace_tokenizer(post: str) -> Tokenizer:
    """A Llama/Mistral-style BPE (Metaspace, byte fallback); ``post``: template, template_eos or none."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"]))
    if post == "template":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    elif post == "template_eos":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
        )
    return tok


def byte_level_tokenizer() -> Tokenizer:
    """A GPT-2 / Qwen-style byte-level BPE with the ByteLevel post-processor (adds no token)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_folder(
    directory: Path, tokenizer: Tokenizer | None, config: dict | None, spm_model: bytes | None = None
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        tokenizer.save(str(directory / "tokenizer.json"))
    if spm_model is not None:
        (directory / "tokenizer.model").write_bytes(spm_model)
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if not (directory / "config.json").exists():  # AutoTokenizer reads model_type when no tokenizer_class is given
        (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return directory


def spm_model() -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4),
        model_writer=out,
        vocab_size=360,
        model_type="bpe",
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=3,
        hard_vocab_limit=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
    )
    return out.getvalue()


LLAMA_CONFIG = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
FOLDERS = {
    # Mistral / Llama 2 style: tokenizer.json adds <s>; no add_bos_token in the config
    "template-bos": (lambda: metaspace_tokenizer("template"), {"bos_token": "<s>", "eos_token": "</s>"}),
    "template-bos-llama-class": (lambda: metaspace_tokenizer("template"), LLAMA_CONFIG),
    # transformers ignores add_bos_token when a tokenizer.json exists: the post-processor still adds <s>
    "template-bos-config-false": (lambda: metaspace_tokenizer("template"), {**LLAMA_CONFIG, "add_bos_token": False}),
    "template-bos-eos": (lambda: metaspace_tokenizer("template_eos"), LLAMA_CONFIG),
    "template-no-config": (lambda: metaspace_tokenizer("template"), None),
    "no-post-processor": (lambda: metaspace_tokenizer("none"), {**LLAMA_CONFIG, "add_bos_token": False}),
    "no-post-processor-config-true": (lambda: metaspace_tokenizer("none"), {**LLAMA_CONFIG, "add_bos_token": True}),
    "byte-level": (
        byte_level_tokenizer,
        {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    ),
}


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_tokenizer_json_folders_match_transformers(tmp_path, name):
    make, config = FOLDERS[name]
    folder = write_folder(tmp_path / name, make(), config)
    ours, theirs = load_tokenizer(str(folder)), transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=True) == theirs(text)["input_ids"], text
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    if name.startswith("template"):  # BOS is <s> even with no tokenizer_config.json (the template's first token)
        assert ours.prefix_ids == (1,) and ours.bos_id == 1 and ours.add_bos_default
        assert ours.suffix_ids == ((2,) if name == "template-bos-eos" else ())
    else:
        assert ours.prefix_ids == ours.suffix_ids == () and not ours.add_bos_default


@pytest.mark.parametrize(
    "config",
    [{}, {"add_bos_token": True}, {"add_bos_token": False}, {"add_bos_token": True, "add_eos_token": True}],
    ids=str,
)
def test_sentencepiece_folders_match_transformers(tmp_path, config):
    folder = write_folder(tmp_path / "spm", None, {**LLAMA_CONFIG, **config}, spm_model=spm_model())
    ours, theirs = load_tokenizer(str(folder)), transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=True) == theirs(text)["input_ids"], text


def test_generate_on_a_llama_folder_matches_transformers(tmp_path, capsys):
    """The issue's case: tokenizer.json adds <s>; ``specrag generate`` must count it and continue as HF does."""
    tok = metaspace_tokenizer("template")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    write_folder(folder, tok, {"bos_token": "<s>", "eos_token": "</s>"})
    prompt = "Speculative RAG drafts answers in parallel and"
    hf_ids = transformers.AutoTokenizer.from_pretrained(str(folder))(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(hf_ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf_new = out[0, hf_ids.shape[1] :].tolist()

    code = main(
        [
            "generate",
            "--model",
            str(folder),
            "--prompt",
            prompt,
            "--max-new-tokens",
            "8",
            "--json",
            "--no-cache",
            "--quiet",
        ]
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    got = json.loads(stdout)
    assert got["num_prompt_tokens"] == hf_ids.shape[1]
    n = len(got["token_ids"])
    assert got["token_ids"] == hf_new[:n] and (n == 8 or got["finish_reason"] == "eos")
