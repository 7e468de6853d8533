"""Serving: started engines (``models/engine``) shared by concurrent requests, and the HTTP app.

Modules: ``adapter`` (engine-backed models for the pipeline), ``service`` (the engines and the pipeline),
``app`` / ``openai_api`` / ``schemas`` / ``metrics`` (HTTP), ``cli`` (``specrag serve``), ``tiny`` (test models).
Import the submodules directly; this package imports nothing heavy.
"""
