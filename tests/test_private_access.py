"""No module of the package reads or writes another object's private members (serving's own, stricter checks:
``tests/serving/test_boundaries.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.serving.test_boundaries import reach_ins

PACKAGE = Path(__file__).resolve().parents[1] / "specrag_jax"
# JAX has no public count of a jitted function's compiled programs; the recompile checks read this one.
ALLOWED = {"_cache_size"}


def test_no_module_reaches_into_another_objects_private_members():
    offenders = [
        f"{p.relative_to(PACKAGE)}:{hit}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for hit in reach_ins(p.read_text())
        if hit.rpartition(".")[2] not in ALLOWED
    ]
    assert not offenders, offenders


def test_the_check_sees_a_reach_in():
    assert reach_ins("index._vectors\nself._own\nsuper()._base()") == ["1: index._vectors"]
