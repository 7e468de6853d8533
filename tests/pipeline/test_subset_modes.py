"""``--subsets``: the flag reaches RAGConfig and the sampler; an unknown mode is a one-line error."""

from __future__ import annotations

import argparse

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.pipeline.clustering import lexical_subsets, subset_sampler
from specrag_jax.pipeline.rag_cli import add_rag_options, rag_config_from_args
from specrag_jax.pipeline.rag_config import RAGConfig

DOCS = [{"title": f"t{i}", "text": f"passage {i} about {'cats' if i % 2 else 'dogs'} and more"} for i in range(12)]


def test_cover_mode_reaches_the_config_and_covers_the_passages():
    p = argparse.ArgumentParser()
    add_rag_options(p)
    cfg = rag_config_from_args(p.parse_args(["--subsets", "cover", "--router-margin", "0.2"]))
    assert cfg.subsets == "cover" and cfg.router_margin == 0.2
    subsets, info = lexical_subsets(cfg.subsets)("q", DOCS, 2, 5, 0)
    assert info["subsets_mode"] == "cover" and set().union(*subsets) == set(range(len(DOCS)))
    sampled, _ = lexical_subsets()("q", DOCS, 2, 5, 0)
    assert all(len(s) == 2 for s in sampled) and len(set().union(*sampled)) < len(DOCS)


def test_an_unknown_subsets_mode_is_a_one_line_error():
    with pytest.raises(SpecRagError) as err:
        RAGConfig(subsets="all").check()
    assert "unknown subsets mode 'all'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SpecRagError):
        subset_sampler("lexical", None, "every")
