"""Byte-level BPE tokenizers (SmolLM2's, Qwen2's), built with the `tokenizers` library from GGUF tokens + merges.

The GGUF stores the vocabulary already spelled in GPT-2's byte alphabet and the merges as "a b"
strings; what it does not store is the pre-tokenizer, only its name in `tokenizer.ggml.pre`. For
"smollm" (like StarCoder's) that is: every digit on its own, then GPT-2's byte-level regex. This is
what SmolLM2's tokenizer.json says (Sequence[Digits(individual_digits), ByteLevel(use_regex)]) and
what llama.cpp runs for that pre-type ("\\p{N}", then the GPT-2 pattern). "qwen2" is Qwen2's
tokenizer.json: NFC, then one regex split (Llama 3's with single digits), then byte-level spelling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer.base import (
    FALLBACK_CHAT_TEMPLATES,
    Tokenizer,
    end_of_turn_ids,
    gguf_template,
)

CONTROL = 3
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's tokenizer.json: Llama 3's split with single digits (\p{N}), after an NFC normalizer.
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    """A regex split (matches kept as pieces), then byte-level spelling without GPT-2's own regex."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# tokenizer.ggml.pre -> the pre-tokenizer of the HF tokenizer.json that llama.cpp fingerprinted as it
PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()]),
    "starcoder": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()]),
    "gpt-2": _byte_level,
    "default": _byte_level,
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}
# Pre-types whose tokenizer.json also normalises the text to NFC first (Qwen2's does).
NFC_PRE_TYPES = frozenset({"qwen2"})


class HFTokenizersTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer`, with control tokens split out of the text before it sees it."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        pad_id: int | None,
        add_bos_default: bool,
        chat_template: str | None,
        special_tokens: dict[str, int],
        backend_splits: bool = False,
    ) -> None:
        """``backend_splits``: the backend knows every control token as an added token and splits the text
        itself (HF folders: then a Metaspace "first" prefix applies once per text, as in transformers)."""
        self.backend = backend
        self.backend_splits = backend_splits
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_ids, self.pad_id = bos_id, eos_ids, pad_id
        self.add_bos_default, self.chat_template = add_bos_default, chat_template
        self._init_special(special_tokens)

    def _encode_text(self, text: str) -> list[int]:
        if self.backend_splits:
            return self.backend.encode(text, add_special_tokens=False).ids
        return super()._encode_text(text)

    def _encode_plain(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def _decode_plain(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        token = self.backend.id_to_token(int(token_id))
        if token is None:
            raise SpecRagError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        return token


def bpe_from_gguf(meta: dict[str, Any]) -> HFTokenizersTokenizer:
    """Byte-level BPE tokenizer from GGUF `tokenizer.*` metadata (tokenizer.ggml.model == "gpt2")."""
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise SpecRagError("GGUF BPE tokenizer needs tokenizer.ggml.tokens and tokenizer.ggml.merges")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise SpecRagError(f"unsupported BPE pre-tokenizer {pre!r} (supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise SpecRagError("GGUF BPE vocabulary has duplicate tokens")
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise SpecRagError(f"malformed BPE merge {merge!r} in GGUF")
        pairs.append((left, right))
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = PRE_TOKENIZERS[pre]()
    if pre in NFC_PRE_TYPES:
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    special = {token: i for i, (token, kind) in enumerate(zip(tokens, types)) if kind == CONTROL}
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    arch = meta.get("general.architecture", "")
    tok = HFTokenizersTokenizer(
        backend,
        bos_id=bos,
        pad_id=meta.get("tokenizer.ggml.padding_token_id"),
        eos_ids=end_of_turn_ids([eos, meta.get("tokenizer.ggml.eot_token_id")], special.get),
        add_bos_default=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta.get("tokenizer.chat_template") or FALLBACK_CHAT_TEMPLATES.get(arch),
        special_tokens=special,
    )
    tok.set_special_template(*gguf_template(meta, tok.add_bos_default))
    return tok
