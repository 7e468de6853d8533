"""Command-line flags for placement: ``--mesh``, ``--drafter-devices``, ``--verifier-devices``.

- ``--mesh data=2,model=4``: the mesh of a model (``generate``), or of each model of a RAG command when no
  device groups are given (drafter and verifier then share the devices).
- ``--drafter-devices 2`` / ``--verifier-devices 6`` (a count, or indices such as ``0,1`` / ``2-7``): disjoint
  device groups; a count takes the next devices in order, and giving only one group hands the other the
  remaining devices. Each group's mesh is ``--mesh`` when given (it must fit the group), else ``model=N``.
"""

from __future__ import annotations

import argparse
import math
from typing import Sequence

import jax

from specrag_jax.errors import SpecRagError
from specrag_jax.parallel.mesh import make_mesh, parse_device_list, parse_mesh_spec
from specrag_jax.parallel.placement import Placement
from specrag_jax.parallel.submesh import ModelPlacements


def add_mesh_arguments(parser: argparse.ArgumentParser, *, groups: bool = True) -> None:
    """Add ``--mesh`` (and, with ``groups``, ``--drafter-devices`` / ``--verifier-devices``) to a parser."""
    g = parser.add_argument_group("devices and sharding")
    g.add_argument(
        "--mesh",
        default=None,
        metavar="SPEC",
        help="device mesh, e.g. 'model=8' or 'data=2,model=4' (default: one device, unsharded)",
    )
    if groups:
        g.add_argument(
            "--drafter-devices",
            default=None,
            metavar="N|IDS",
            help="devices of the drafter: a count ('2') or indices ('0,1', '0-1'); disjoint from the verifier's",
        )
        g.add_argument(
            "--verifier-devices",
            default=None,
            metavar="N|IDS",
            help="devices of the verifier (default with --drafter-devices: the remaining ones)",
        )


def placement_from_args(args: argparse.Namespace, devices: Sequence[jax.Device] | None = None) -> Placement | None:
    """One model's placement from ``--mesh`` (None: the default single device)."""
    spec = getattr(args, "mesh", None)
    if not spec:
        return None
    devices = list(jax.devices() if devices is None else devices)
    size = math.prod(parse_mesh_spec(spec).values())
    if size > len(devices):
        raise SpecRagError(f"--mesh {spec} needs {size} devices but {len(devices)} are available")
    return Placement(make_mesh(spec, devices[:size]))


def _group(text: str, devices: list, taken: set[int]) -> list:
    """Devices of one group: a count takes the next free devices in order, a list names them."""
    if text.strip().isdigit():
        free = [d for d in devices if d.id not in taken]
        n = int(text)
        if not 1 <= n <= len(free):
            raise SpecRagError(f"asked for {n} devices but {len(free)} are free (of {len(devices)})")
        return free[:n]
    return parse_device_list(text, devices)


def placements_from_args(args: argparse.Namespace, devices: Sequence[jax.Device] | None = None) -> ModelPlacements:
    """Drafter and verifier placements from the flags (both None when no flag is given)."""
    d_text, v_text = getattr(args, "drafter_devices", None), getattr(args, "verifier_devices", None)
    if d_text is None and v_text is None:
        shared = placement_from_args(args, devices)
        return ModelPlacements(shared, shared)
    devices = list(jax.devices() if devices is None else devices)
    taken: set[int] = set()
    groups: dict[str, list] = {}
    for name, text in (("drafter", d_text), ("verifier", v_text)):
        if text is not None:
            groups[name] = _group(text, devices, taken)
            taken |= {d.id for d in groups[name]}
    for name in ("drafter", "verifier"):
        if name not in groups:
            rest = [d for d in devices if d.id not in taken]
            if not rest:
                raise SpecRagError(f"no devices left for the {name}: all {len(devices)} are taken")
            groups[name] = rest
    if {d.id for d in groups["drafter"]} & {d.id for d in groups["verifier"]}:
        raise SpecRagError("--drafter-devices and --verifier-devices overlap; give them disjoint devices")
    spec = getattr(args, "mesh", None)
    return ModelPlacements(*(Placement(make_mesh(spec, groups[n])) for n in ("drafter", "verifier")))
