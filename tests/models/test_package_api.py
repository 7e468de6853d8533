"""The models package's public names: every listed name resolves, and importing a module stays cheap."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = [
    "specrag_jax.models",
    "specrag_jax.models.decoder",
    "specrag_jax.models.loading",
    "specrag_jax.models.tokenizer",
    "specrag_jax.models.sampling",
    "specrag_jax.models.speculative",
    "specrag_jax.models.executor",
]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package):
    module = importlib.import_module(package)
    assert module.__all__ == sorted(set(module.__all__))
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        value = getattr(module, name)
        home = getattr(value, "__module__", None)
        if home is not None and home.startswith("specrag_jax."):  # defined in the subpackage, not re-exported
            assert home.startswith(package), (name, home)
    with pytest.raises(AttributeError):
        _ = module.no_such_name


def test_documented_import_paths():
    """The README's Python API: these import paths are public."""
    from specrag_jax.models.sampling import SamplingParams
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.models.tokenizer import Tokenizer, load_tokenizer

    assert SamplingParams().temperature >= 0 and callable(TextModel.load)
    assert callable(load_tokenizer) and isinstance(Tokenizer, type)


def test_importing_the_cli_or_a_module_imports_nothing_heavy():
    """``specrag`` starts without JAX: the CLI imports ``models.loading.registry``, whose packages' __init__
    files import nothing eagerly."""
    code = (
        "import sys, specrag_jax.cli, specrag_jax.models.loading.registry, specrag_jax.models.sampling\n"
        "print(sorted(m for m in ('jax', 'flax', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
