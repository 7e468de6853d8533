"""Tiny random-weight models with a character tokenizer: fast stand-ins for tests and load checks.

``specrag serve --drafter tiny:llama --verifier tiny:gemma3`` serves these; the text they write is noise,
but every code path (paging, batching, the prefix cache, HTTP) is the real one.
"""

from __future__ import annotations

from typing import Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.text_model import TextModel
from specrag_jax.models.tokenizer.base import Tokenizer

_CHARS = "\n" + "".join(chr(c) for c in range(32, 125))  # ids 3.. ; 0 pad, 1 BOS, 2 EOS


class CharTokenizer(Tokenizer):
    """One id per character (newline and printable ASCII); other characters become '?'."""

    def __init__(self, vocab_size: int = 97) -> None:
        if vocab_size < 3 + len(_CHARS):
            raise SpecRagError(f"a character tokenizer needs a vocabulary of >= {3 + len(_CHARS)}")
        self.vocab_size, self.bos_id, self.eos_ids, self.pad_id = vocab_size, 1, (2,), 0
        self.add_bos_default, self.chat_template = True, None
        self._index = {c: i + 3 for i, c in enumerate(_CHARS)}
        self._init_special({})

    def _encode_plain(self, text: str) -> list[int]:
        q = self._index["?"]
        return [self._index.get(c, q) for c in text]

    def _decode_plain(self, ids: Sequence[int]) -> str:
        return "".join(_CHARS[i - 3] if 3 <= i < 3 + len(_CHARS) else "" for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return self._index.get(token)

    def id_to_token(self, token_id: int) -> str:
        return {0: "<pad>", 1: "<s>", 2: "</s>"}.get(int(token_id)) or self._decode_plain([int(token_id)])


def tiny_text_model(
    spec: str, *, seed: int = 0, num_pages: int = 256, page_size: int = 16, max_seq_len: int = 1024
) -> TextModel:
    """``tiny:<arch>`` (llama, qwen2 or gemma3): a random 2-layer model with a character tokenizer."""
    arch = spec.split(":", 1)[1] if ":" in spec else "llama"
    if arch not in ("llama", "qwen2", "gemma3"):
        raise SpecRagError(f"unknown tiny model {spec!r}; use tiny:llama, tiny:qwen2 or tiny:gemma3")
    cfg = tiny_config(arch, tie_embeddings=arch == "gemma3")
    runner = ModelRunner(
        cfg, init_params(cfg, seed=seed), num_pages=num_pages, page_size=page_size, max_seq_len=max_seq_len
    )
    return TextModel(spec, runner, CharTokenizer(cfg.vocab_size))
