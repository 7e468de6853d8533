"""Tokenizers for the supported models: one small interface, built from a GGUF header or an HF folder.

`load_tokenizer("gemma3-270m")` builds a SentencePiece tokenizer from the GGUF vocabulary (see
spm.py); `load_tokenizer("smollm2-135m-instruct")` a byte-level BPE one with the `tokenizers`
library (see bpe.py); an HF folder's tokenizer.json or tokenizer.model with the special-token
template transformers applies (see hf.py). The interface is ``base.Tokenizer``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from specrag_jax.errors import SpecRagError
from specrag_jax.models.loading.registry import resolve_model_path
from specrag_jax.models.tokenizer.base import Tokenizer
from specrag_jax.models.tokenizer.bpe import bpe_from_gguf
from specrag_jax.models.tokenizer.gguf_metadata import read_gguf_tokenizer_metadata
from specrag_jax.models.tokenizer.hf import hf_folder_tokenizer
from specrag_jax.models.tokenizer.spm import spm_from_gguf


@functools.lru_cache(maxsize=8)
def load_tokenizer(path_or_name: str) -> Tokenizer:
    """The tokenizer of a known model name, a .gguf file, or an HF folder (tokenizer.json / tokenizer.model).

    Cached per name and per resolved path, so a name and its file share one tokenizer object.
    """
    return _load_path(str(resolve_model_path(str(path_or_name)).resolve()))


@functools.lru_cache(maxsize=8)
def _load_path(path_str: str) -> Tokenizer:
    path = Path(path_str)
    if path.is_dir():
        return hf_folder_tokenizer(path)
    meta = read_gguf_tokenizer_metadata(path)
    model = meta.get("tokenizer.ggml.model")
    if model == "llama":
        return spm_from_gguf(meta)
    if model == "gpt2":
        return bpe_from_gguf(meta)
    raise SpecRagError(
        f"unsupported tokenizer model {model!r} in {path} (supported: 'llama' SentencePiece, 'gpt2' BPE)"
    )
