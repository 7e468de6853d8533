"""specrag-jax: Speculative RAG in JAX. A small drafter writes answer drafts from subsets of the retrieved passages,
a larger verifier scores them all in one forward pass; a router decides per question whether drafting pays.

The public names, imported on first use (``import specrag_jax`` itself imports no JAX):

- ``build_specrag(drafter, verifier, corpus, config)``: load both models and a BM25 index -> ``SpecRAG``;
  ``SpecRAG.answer(question, docs=None, method="auto")`` -> ``RAGAnswer`` (answer, rationale, citations, drafts,
  trace); ``RAGConfig`` holds every pipeline setting, ``METHODS`` the method names;
- ``TextModel`` (load a model by name, generate text) and ``SamplingParams``;
- ``FunctionalModel`` (``FunctionalModel.load(name)``: a model as its Flax module, parameter pytree and tokenizer,
  with pure functions of ``(params, token_ids)`` for logits and log-probabilities under your own ``jax.jit`` /
  ``jax.grad``, no page pool);
- ``load_corpus`` / ``default_corpus``: documents to search (JSON lines or a folder of text files);
- ``Service`` / ``ServeConfig`` / ``create_app``: the OpenAI-compatible server over started engines.
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "pipeline.factory": ("build_specrag", "DEFAULT_DRAFTER", "DEFAULT_VERIFIER"),
    "pipeline.specrag": ("SpecRAG", "METHODS"),
    "pipeline.rag_config": ("RAGConfig",),
    "pipeline.rag_answer": ("RAGAnswer",),
    "models.text_model": ("TextModel",),
    "models.functional": ("FunctionalModel",),
    "models.sampling.params": ("SamplingParams",),
    "retrieval.corpus": ("load_corpus", "default_corpus"),
    "serving.service": ("Service", "ServeConfig"),
    "serving.app": ("create_app",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
