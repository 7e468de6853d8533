"""Dense retrieval and question-conditioned embeddings with real SmolLM2-135M hidden states."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.decoder.transformer import logits_at
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.text_model import TextModel
from specrag_jax.retrieval import DenseIndex, Embedder, hidden_states, kmeans

pytestmark = pytest.mark.slow

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France, built for the 1889 World's Fair.",
    "Photosynthesis is the process by which green plants use sunlight to turn water and carbon dioxide into sugar.",
    "Python is a high-level programming language known for its readable syntax and large standard library.",
    "The mitochondrion is the organelle that produces most of the chemical energy (ATP) in a cell.",
    "Mount Everest, on the border of Nepal and China, is the highest mountain above sea level on Earth.",
    "Basketball was invented by James Naismith in 1891 in Springfield, Massachusetts.",
]
PARAPHRASES = [  # no content word shared with the document, except a date in the first
    "Which iron monument in the French capital was made for an exposition in 1889?",
    "How do plants make food from light?",
    "Which coding language is famous for being easy to read?",
    "Which part of a cell is the powerhouse that generates energy?",
    "What is the tallest peak in the world?",
    "Who created the game of basketball?",
]


@pytest.fixture(scope="module")
def embedder():
    return Embedder(TextModel.load("smollm2-135m-instruct", max_seq_len=512, max_batch=1))


@pytest.fixture(scope="module")
def index(embedder):
    return DenseIndex.build([{"id": str(i), "title": "", "text": t} for i, t in enumerate(DOCS)], embedder)


def test_paraphrased_queries_rank_their_document_first(index, embedder):
    for i, query in enumerate(PARAPHRASES):  # one query per call, as at serving time
        hits = index.search(query, 3)
        assert hits[0][0] == i, (query, hits)
        assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    q = embedder.embed([PARAPHRASES[0]])
    assert q.shape == (1, 576) and np.linalg.norm(q[0]) == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(SpecRagError, match=">= 1"):
        index.search_vector(q[0], 0)


def test_batching_does_not_change_embeddings(embedder, index):
    alone = embedder.embed([DOCS[2]])[0]
    np.testing.assert_allclose(alone, index.embeddings[2], atol=2e-5)


def test_save_reload_and_model_check(index, embedder, tmp_path):
    path = index.save(tmp_path / "dense")
    loaded = DenseIndex.load(path, embedder)
    np.testing.assert_array_equal(loaded.embeddings, index.embeddings)
    np.testing.assert_array_equal(loaded.mean, index.mean)
    assert loaded.docs == index.docs and loaded.model == "smollm2-135m-instruct"
    q = embedder.embed([PARAPHRASES[0]])[0]
    assert loaded.search_vector(q, 6) == index.search_vector(q, 6)
    with pytest.raises(SpecRagError, match="no embedder"):
        DenseIndex.load(path).search("anything")
    other = Embedder.__new__(Embedder)
    other.name = "gemma3-270m"
    with pytest.raises(SpecRagError, match="built with model 'smollm2-135m-instruct'"):
        DenseIndex.load(path, other)


def test_question_conditioned_embeddings_cluster_by_topic(embedder):
    docs = [
        {"id": "a", "title": "Bees", "text": "Honey bees collect nectar from flowers and store honey in wax combs."},
        {"id": "b", "title": "Lists", "text": "Python lists are mutable sequences; tuples are immutable."},
        {"id": "c", "title": "Hives", "text": "A bee colony has one queen, many female workers and a few drones."},
        {"id": "d", "title": "CPython", "text": "The Python interpreter compiles source code to bytecode first."},
    ]
    question = "What do bees and Python have in common?"
    emb = embedder.embed_for_question(question, docs)
    assert emb.shape == (4, 576)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    labels = kmeans(emb, 2, seed=0).labels
    assert labels[0] == labels[2] != labels[1] == labels[3]
    # Conditioning matters: another question moves the embeddings; the same question reproduces them.
    other = embedder.embed_for_question("Which of these mentions a queen?", docs)
    assert np.abs(other - emb).max() > 1e-3
    np.testing.assert_allclose(embedder.embed_for_question(question, docs), emb, atol=1e-6)
    with pytest.raises(SpecRagError, match="non-empty question"):
        embedder.embed_for_question("  ", docs)


def test_hidden_states_match_the_runner(embedder):
    runner = embedder.runner
    ids = embedder.tokenizer.encode("The quick brown fox", add_bos=True)
    step = runner.pack([Chunk(pages=[], kv_len=0, tokens=ids, write=False, rows=[len(ids) - 1])])
    hidden = hidden_states(runner, step)
    assert hidden.shape == (step.tokens.shape[0], 576)
    ours = np.asarray(logits_at(runner.params, runner.cfg, hidden[len(ids) - 1][None]))
    np.testing.assert_allclose(ours, runner.logits(step), atol=2e-3, rtol=1e-4)
