"""A drafter that shares the verifier's vocabulary hands over its drafts as token ids: verification scores the ids
the drafter wrote and lossless decoding proposes them, with no re-tokenising (``RAGConfig.shared_vocab``)."""

from __future__ import annotations

from typing import Any

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer.base import Tokenizer
from specrag_jax.models.tokenizer.vocabulary import same_vocabulary

SHARED_VOCAB_MODES = ("auto", "require", "off")  # auto: when the vocabularies agree; require: an error if not


def check_shared_vocab(mode: str) -> None:
    if mode not in SHARED_VOCAB_MODES:
        raise SpecRagError(f"shared_vocab must be one of {', '.join(SHARED_VOCAB_MODES)} (got {mode!r})")


def require_same_vocabulary(drafter: str, drafter_tok: Tokenizer, verifier: str, verifier_tok: Tokenizer) -> None:
    """A one-line error naming both models when their vocabularies differ (``shared_vocab`` "require")."""
    if not same_vocabulary(drafter_tok, verifier_tok):
        raise SpecRagError(
            f"shared_vocab 'require': the drafter {drafter} ({drafter_tok.vocab_size} tokens) and the verifier "
            f"{verifier} ({verifier_tok.vocab_size} tokens) have different vocabularies; choose a drafter with the "
            "verifier's tokenizer (qwen2.5-coder-0.5b-instruct for qwen2.5-coder-1.5b-instruct) or shared_vocab 'auto'"
        )


def uses_shared_ids(drafter: Any, verifier: Any, mode: str) -> bool:
    """Whether drafts travel as the drafter's token ids (the models' tokenizers are compared, no weights loaded);
    ``mode`` "require" with two vocabularies is ``require_same_vocabulary``'s error."""
    check_shared_vocab(mode)
    if mode == "off":
        return False
    if mode == "require":
        require_same_vocabulary(
            getattr(drafter, "name", "?"), drafter.tokenizer, getattr(verifier, "name", "?"), verifier.tokenizer
        )
        return True
    return same_vocabulary(drafter.tokenizer, verifier.tokenizer)
