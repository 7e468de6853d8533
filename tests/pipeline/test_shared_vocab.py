"""A drafter with the verifier's vocabulary hands over token ids: verification scores the ids the drafter wrote and
lossless decoding proposes them (the answer still standard RAG's, token for token); a drafter with another
vocabulary where one is required is a one-line error before any weights load."""

from __future__ import annotations

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer.vocabulary import same_vocabulary
from specrag_jax.pipeline.drafting import Draft
from specrag_jax.pipeline.lossless import draft_token_streams
from specrag_jax.pipeline.rag_config import RAGConfig
from specrag_jax.pipeline.shared_vocab import uses_shared_ids
from specrag_jax.serving.tiny import CharTokenizer

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-1.5b-instruct"
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"
DOCS = [
    {"id": "a", "title": "Paris", "text": "Paris is the capital and largest city of France. It lies on the Seine."},
    {"id": "b", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine."},
    {"id": "c", "title": "Berlin", "text": "Berlin is the capital of Germany."},
]


class _Model:
    def __init__(self, name: str, tokenizer) -> None:
        self.name, self.tokenizer = name, tokenizer


def test_vocabularies_compare_by_every_token():
    a, b, c = CharTokenizer(300), CharTokenizer(300), CharTokenizer(301)
    assert same_vocabulary(a, b) and not same_vocabulary(a, c)
    assert uses_shared_ids(_Model("x", a), _Model("y", b), "auto")
    assert not uses_shared_ids(_Model("x", a), _Model("y", b), "off")
    assert not uses_shared_ids(_Model("x", a), _Model("y", c), "auto")
    with pytest.raises(SpecRagError, match="the drafter x .301 tokens.* the verifier y .300 tokens") as err:
        uses_shared_ids(_Model("x", c), _Model("y", a), "require")
    assert "\n" not in str(err.value)
    with pytest.raises(SpecRagError, match="shared_vocab must be one of auto, require, off"):
        RAGConfig(shared_vocab="yes").check()


def test_draft_streams_use_the_drafts_own_ids():
    tok = CharTokenizer(300)
    d = Draft(0, ["a"], "", "Paris is the capital.", "Paris", True, -1.0, 3, rationale_ids=[5, 6, 7], answer_ids=[8, 9])
    assert draft_token_streams(tok, [d], shared=True) == [[8, 9], [5, 6, 7]]
    retokenised = draft_token_streams(tok, [d], shared=False)
    assert [8, 9] not in retokenised and tok.encode("Paris") in retokenised
    assert "answer_ids" not in d.to_dict()  # the text says the same


@pytest.mark.slow
def test_the_verifiers_sibling_shares_its_vocabulary_and_smollm2_does_not():
    from specrag_jax.models.tokenizer.load import load_tokenizer

    assert same_vocabulary(load_tokenizer(QWEN_SMALL), load_tokenizer(QWEN))
    assert not same_vocabulary(load_tokenizer(SMOL), load_tokenizer(QWEN))
    from specrag_jax.pipeline.factory import build_specrag

    with pytest.raises(SpecRagError, match="different vocabularies") as err:
        build_specrag(SMOL, QWEN, None, RAGConfig(shared_vocab="require"))
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def rag():
    from specrag_jax.pipeline.factory import build_specrag

    cfg = RAGConfig(m=2, max_answer_tokens=24, shared_vocab="require", proposer="drafts")
    return build_specrag(SMOL, SMOL, None, cfg, max_seq_len=1024)


@pytest.mark.slow
def test_shared_ids_go_into_verification_and_lossless_decoding(rag):
    assert rag.shared_ids
    q = "What is the capital of France?"
    out = rag.answer_methods(q, DOCS, ["standard", "lossless"])
    assert out["lossless"].answer == out["standard"].answer  # the drafts only propose
    drafts = out["lossless"].drafts
    assert any(d.shared_ids() for d in drafts)
    for d in drafts:
        if d.shared_ids():
            assert rag.drafter.tokenizer.decode(d.answer_ids).strip() == d.answer
    trace: dict = {}
    rag.verify(q, DOCS, drafts, trace)
    for d in drafts:
        if d.shared_ids():  # the verifier scored exactly the drafter's tokens
            assert d.sc_tokens == len(d.rationale_ids) + len(d.answer_ids)
    assert rag.verifier.runner.allocator.num_free == rag.verifier.runner.allocator.num_usable
