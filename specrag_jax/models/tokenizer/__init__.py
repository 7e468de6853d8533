"""Tokenizers for the supported models: one small interface, built from a GGUF header or an HF folder.

``load`` (``load_tokenizer``: a model name or path -> tokenizer), ``base`` (the ``Tokenizer`` interface, chat
templates, control tokens), ``spm`` (SentencePiece: Gemma's, or an HF folder's tokenizer.model), ``bpe``
(byte-level BPE with the ``tokenizers`` library: SmolLM2's, Qwen2's), ``hf`` (HF folders with the special tokens
transformers adds), ``gguf_metadata`` (the tokenizer part of a GGUF header, read fast).
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "base": ("Tokenizer",),
    "load": ("load_tokenizer",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
