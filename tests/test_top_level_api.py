"""``import specrag_jax`` gives the public API: every name resolves, and the bare import loads no JAX."""

from __future__ import annotations

import subprocess
import sys

import pytest

import specrag_jax


def test_every_top_level_name_resolves():
    assert specrag_jax.__all__ == sorted(set(specrag_jax.__all__))
    names = {"build_specrag", "SpecRAG", "RAGConfig", "RAGAnswer", "TextModel", "SamplingParams", "FunctionalModel"}
    assert names <= set(specrag_jax.__all__)
    for name in specrag_jax.__all__:
        assert getattr(specrag_jax, name) is not None
    assert specrag_jax.METHODS[0] == "auto" and specrag_jax.RAGConfig().router_max_loss == 0.0
    with pytest.raises(AttributeError):
        _ = specrag_jax.no_such_name


def test_the_bare_import_is_cheap():
    code = "import sys, specrag_jax; print('jax' in sys.modules, len(specrag_jax.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False" and int(out[1]) >= 10
