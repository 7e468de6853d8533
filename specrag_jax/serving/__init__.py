"""Serving: continuous-batching engines over shared page pools, a radix prefix cache, and the HTTP app.

Modules: ``engine`` (the step loop), ``steps`` (building a step), ``admission`` and ``prefix_cache`` (pages),
``policy`` (token budget, backpressure), ``adapter`` (engine-backed models for the pipeline), ``service``,
``app`` / ``openai_api`` / ``schemas`` / ``metrics`` (HTTP), ``cli`` (``specrag serve``), ``tiny`` (test models).
Import the submodules directly; this package imports nothing heavy.
"""
