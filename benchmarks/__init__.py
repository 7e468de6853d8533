"""Benchmarks for specrag-jax (run as scripts: ``python benchmarks/generate.py``)."""
