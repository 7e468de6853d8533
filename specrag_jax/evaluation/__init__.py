"""Evaluation: ``specrag eval`` over the paper's benchmark files, above the method (``specrag_jax.pipeline``).

``run`` evaluates every method on one file (accuracy, latency, tokens, roofline: the eval JSON), ``suite`` /
``suite_cli`` / ``suite_table`` run a folder of files and build Table 1, ``router_report`` the eval JSON's router
section, ``holdout`` the stratified train / held-out splits (shared with ``make-drafter-data``), and ``datasets``
the readers and metrics of the paper's formats (Self-RAG, MuSiQue, RetrievalQA).
"""
