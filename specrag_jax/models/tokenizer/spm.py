"""SentencePiece tokenizers: Gemma's, rebuilt from a GGUF vocabulary, or an HF folder's tokenizer.model.

A GGUF "llama" tokenizer stores the pieces, scores and piece types of the original tokenizer.model, so
the model proto is rebuilt from them and run by the real `sentencepiece` library. The settings that
the GGUF does not store are Gemma's: a BPE model with byte fallback and split digits, an identity
normalizer that only escapes spaces as U+2581, no dummy prefix space and no whitespace squeezing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer.base import (
    FALLBACK_CHAT_TEMPLATES,
    Tokenizer,
    end_of_turn_ids,
    gguf_template,
)

# GGUF token types (llama.cpp's llama_token_type) share their numbers with SentencePiece's piece types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"


class SentencePieceTokenizer(Tokenizer):
    """A SentencePieceProcessor, with control tokens split out of the text before it sees it."""

    def __init__(
        self,
        proto: pb.ModelProto,
        *,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        pad_id: int | None,
        add_bos_default: bool,
        chat_template: str | None,
        special_tokens: dict[str, int],
    ) -> None:
        self.processor = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        self.vocab_size = self.processor.get_piece_size()
        self.bos_id, self.eos_ids, self.pad_id = bos_id, eos_ids, pad_id
        self.add_bos_default, self.chat_template = add_bos_default, chat_template
        self._init_special(special_tokens)

    def _encode_plain(self, text: str) -> list[int]:
        return self.processor.encode(text, out_type=int)

    def _decode_plain(self, ids: Sequence[int]) -> str:
        return self.processor.decode(list(ids))

    def token_to_id(self, token: str) -> int | None:
        if token in self.special_tokens:
            return self.special_tokens[token]
        token_id = self.processor.piece_to_id(token)
        # piece_to_id answers unk_id for unknown strings; only the real "<unk>" piece may map there.
        if token_id == self.processor.unk_id() and token != self.processor.id_to_piece(token_id):
            return None
        return token_id

    def id_to_token(self, token_id: int) -> str:
        return self.processor.id_to_piece(int(token_id))


def build_spm_proto(
    tokens: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int],
    *,
    unk_id: int,
    bos_id: int | None,
    eos_id: int | None,
    pad_id: int | None,
    add_space_prefix: bool,
) -> pb.ModelProto:
    """A BPE SentencePiece model proto with Gemma's settings over a GGUF vocabulary."""
    proto = pb.ModelProto()
    trainer = proto.trainer_spec
    trainer.model_type = pb.TrainerSpec.BPE
    trainer.vocab_size = len(tokens)
    trainer.byte_fallback = True
    trainer.split_digits = True
    trainer.allow_whitespace_only_pieces = True
    trainer.unk_id = unk_id
    trainer.bos_id = -1 if bos_id is None else bos_id
    trainer.eos_id = -1 if eos_id is None else eos_id
    trainer.pad_id = -1 if pad_id is None else pad_id
    for field, token_id in (("unk_piece", unk_id), ("bos_piece", bos_id), ("eos_piece", eos_id), ("pad_piece", pad_id)):
        if token_id is not None:
            setattr(trainer, field, tokens[token_id])
    norm = proto.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = add_space_prefix
    norm.remove_extra_whitespaces = False
    norm.escape_whitespaces = True
    pieces = proto.pieces
    for index, (token, score, kind) in enumerate(zip(tokens, scores, types)):
        if kind == USER_DEFINED and " " in token:
            # llama.cpp writes the spaces of user-defined pieces ("▁▁" runs) as real spaces; undo that.
            token = token.replace(" ", _SPACE)
        if index == unk_id:
            kind = UNKNOWN  # GGUF marks <unk> CONTROL; SentencePiece needs exactly one UNKNOWN piece
        elif kind not in (NORMAL, CONTROL, USER_DEFINED, UNUSED, BYTE):
            kind = NORMAL
        pieces.add(piece=token, score=score, type=kind)
    return proto


def spm_from_gguf(meta: dict[str, Any]) -> SentencePieceTokenizer:
    """Gemma-style SentencePiece tokenizer from GGUF `tokenizer.*` metadata."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise SpecRagError("GGUF file has no tokenizer.ggml.tokens")
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if not len(tokens) == len(scores) == len(types):
        raise SpecRagError("GGUF tokenizer arrays (tokens, scores, token_type) differ in length")
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    pad = meta.get("tokenizer.ggml.padding_token_id")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    if unk is None:
        unk = next((i for i, t in enumerate(types) if t == UNKNOWN), None)
    if unk is None:
        raise SpecRagError("GGUF SentencePiece vocabulary has no unknown token")
    proto = build_spm_proto(
        tokens,
        scores,
        types,
        unk_id=unk,
        bos_id=bos,
        eos_id=eos,
        pad_id=pad,
        add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
    )
    special = {token: i for i, (token, kind) in enumerate(zip(tokens, types)) if kind == CONTROL}
    arch = meta.get("general.architecture", "")
    template = meta.get("tokenizer.chat_template") or FALLBACK_CHAT_TEMPLATES.get(arch)
    lookup = special.get
    eos_ids = end_of_turn_ids([eos, meta.get("tokenizer.ggml.eot_token_id")], lookup)
    tok = SentencePieceTokenizer(
        proto,
        bos_id=bos,
        eos_ids=eos_ids,
        pad_id=pad,
        # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise
        add_bos_default=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        chat_template=template,
        special_tokens=special,
    )
    tok.set_special_template(*gguf_template(meta, tok.add_bos_default))
    return tok
