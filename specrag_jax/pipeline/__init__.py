"""The method: Speculative RAG's steps for one question and the ``SpecRAG`` API that runs them.

Retrieve and rerank (``reranking``, ``progressive``), group the passages into subsets (``clustering``), draft
from each subset (``prompts``, ``drafting``), verify every draft in one pass (``verifier_prompts``,
``verification``), decide (``selection``, the cascade's fallback, ``lossless``), and per question choose between
the exact path and the cascade (``router``, ``route_predictor``, ``router_calibration.json``, the cost model in
``roofline``). ``specrag`` holds ``SpecRAG`` and its baselines, ``rag_config`` / ``rag_answer`` its settings
and result, ``factory`` ``build_specrag``, ``closed_set`` the closed-set tasks' prompts and labels,
``concurrent_answers`` questions answered on started engines, ``rag_cli`` the flags ``ask`` and ``eval`` share.

Evaluation (``specrag_jax.evaluation``) and drafter data (``specrag_jax.drafter_data``) sit above this package;
nothing here imports them.
"""
