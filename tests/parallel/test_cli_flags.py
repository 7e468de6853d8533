"""--mesh / --drafter-devices / --verifier-devices parsing (fake device lists; no model loads)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.parallel.cli import add_mesh_arguments, placement_from_args, placements_from_args


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    id: int
    platform: str = "cpu"


DEVS = [FakeDevice(i) for i in range(8)]


def parse(*argv):
    p = argparse.ArgumentParser()
    add_mesh_arguments(p)
    return p.parse_args(list(argv))


def ids(placement):
    return [d.id for d in placement.devices]


def test_no_flags_means_default_placement():
    assert placement_from_args(parse(), DEVS) is None
    pl = placements_from_args(parse(), DEVS)
    assert pl.drafter is None and pl.verifier is None


def test_shared_mesh_and_disjoint_groups():
    pl = placements_from_args(parse("--mesh", "data=2,model=4"), DEVS)
    assert pl.drafter is pl.verifier and dict(pl.verifier.mesh.shape) == {"data": 2, "model": 4}
    pl = placements_from_args(parse("--drafter-devices", "2"), DEVS)
    assert ids(pl.drafter) == [0, 1] and ids(pl.verifier) == [2, 3, 4, 5, 6, 7] and pl.disjoint()
    assert pl.verifier.spec == "model=6"
    pl = placements_from_args(parse("--drafter-devices", "6-7", "--verifier-devices", "0-3"), DEVS)
    assert ids(pl.drafter) == [6, 7] and ids(pl.verifier) == [0, 1, 2, 3]
    pl = placements_from_args(
        parse("--drafter-devices", "4", "--verifier-devices", "4", "--mesh", "data=2,model=2"), DEVS
    )
    assert pl.drafter.spec == pl.verifier.spec == "data=2,model=2" and pl.disjoint()
    assert placement_from_args(parse("--mesh", "model=4"), DEVS).spec == "model=4"


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--mesh", "model=16"], "needs 16 devices but 8 are available"),
        (["--drafter-devices", "0-3", "--verifier-devices", "3-7"], "overlap"),
        (["--drafter-devices", "8"], "no devices left for the verifier"),
        (["--drafter-devices", "2", "--verifier-devices", "7"], "asked for 7 devices but 6 are free"),
        (["--drafter-devices", "2", "--mesh", "model=4"], "mesh model=4 needs 4 devices but 2 are given"),
    ],
)
def test_bad_flags_raise_one_line_errors(argv, msg):
    with pytest.raises(SpecRagError, match=msg):
        placements_from_args(parse(*argv), DEVS)


def test_specrag_generate_rejects_a_mesh_larger_than_the_devices(capsys):
    from specrag_jax.cli import main

    assert main(["generate", "--prompt", "hi", "--mesh", "model=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["specrag: error: --mesh model=2 needs 2 devices but 1 are available"]
