"""Drafter training data (``specrag make-drafter-data``), beside ``specrag_jax.training`` which trains on it.

``examples`` turns teacher rationales over clustered document subsets into training examples, ``synthetic_questions``
writes question rows from corpus passages, ``records`` stores the teacher's work by reference and replays it,
``cli`` is the command. ``drafter_records/`` holds the project's tracked records files (its README says how each
was written). Above ``specrag_jax.pipeline`` and ``specrag_jax.evaluation``; ``training`` never imports it.
"""
