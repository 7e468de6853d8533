"""Whether two tokenizers share one vocabulary: the same token for every id and the same special tokens, so that
one model's token ids mean the same text to the other (a drafter's ids can go into a verifier's tree as they are)."""

from __future__ import annotations

import functools
import hashlib

from specrag_jax.models.tokenizer.base import Tokenizer


@functools.lru_cache(maxsize=16)
def _fingerprint(tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256()
    digest.update(str(tokenizer.vocab_size).encode())
    for token_id in range(tokenizer.vocab_size):
        digest.update(tokenizer.id_to_token(token_id).encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    for name, token_id in sorted(tokenizer.special_tokens.items()):
        digest.update(f"{name}={token_id}\0".encode())
    return digest.hexdigest()


def vocabulary_fingerprint(tokenizer: Tokenizer) -> str:
    """A hash of every id's token and the special tokens (computed once per tokenizer)."""
    return _fingerprint(tokenizer)


def same_vocabulary(a: Tokenizer, b: Tokenizer) -> bool:
    """True when ``a`` and ``b`` map every id to the same token (and agree on the special tokens)."""
    if a is b:
        return True
    return a.vocab_size == b.vocab_size and vocabulary_fingerprint(a) == vocabulary_fingerprint(b)
