"""Device meshes from a spec string (``data=2,model=4``), device subsets and disjoint sub-meshes."""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from specrag_jax.errors import SpecRagError

DEFAULT_AXES = ("data", "model")


def parse_mesh_spec(spec: str) -> dict[str, int]:
    """``"data=2,model=4"`` -> ``{"data": 2, "model": 4}`` (order kept). A bare ``"8"`` means ``model=8``."""
    spec = (spec or "").strip()
    if not spec:
        raise SpecRagError("empty mesh spec; write e.g. 'model=8' or 'data=2,model=4'")
    if spec.isdigit():
        spec = f"model={spec}"
    axes: dict[str, int] = {}
    for part in spec.split(","):
        name, sep, size = part.strip().partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not size.strip().isdigit():
            raise SpecRagError(f"bad mesh spec {spec!r}: each part must be NAME=SIZE, e.g. 'data=2,model=4'")
        if name in axes:
            raise SpecRagError(f"bad mesh spec {spec!r}: axis {name!r} appears twice")
        if int(size) < 1:
            raise SpecRagError(f"bad mesh spec {spec!r}: axis {name!r} has size {size} (must be >= 1)")
        axes[name] = int(size)
    return axes


def parse_device_list(text: str, devices: Sequence[jax.Device] | None = None) -> list[jax.Device]:
    """``"0-1"``, ``"2,3,4"`` or a count ``"2"`` (first two) -> devices, by index into ``devices``."""
    devices = list(jax.devices() if devices is None else devices)
    text = (text or "").strip()
    if text.isdigit():
        n = int(text)
        if not 1 <= n <= len(devices):
            raise SpecRagError(f"asked for {n} devices but {len(devices)} are available")
        return devices[:n]
    ids: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            ids.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise SpecRagError(
            f"bad device list {text!r}: write a count ('2'), indices ('0,1') or a range ('2-7')"
        ) from None
    bad = [i for i in ids if not 0 <= i < len(devices)]
    if bad:
        raise SpecRagError(f"device index {bad[0]} out of range: {len(devices)} devices are available")
    if len(set(ids)) != len(ids):
        raise SpecRagError(f"bad device list {text!r}: a device appears twice")
    return [devices[i] for i in ids]


def make_mesh(spec: str | dict[str, int] | Mesh | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over ``devices`` (default: all of ``jax.devices()``) shaped by ``spec``.

    The product of the axis sizes must equal the number of devices; a missing spec puts every device on
    ``model``. Axes are ``AxisType.Auto`` (GSPMD propagation inside jit), not JAX's explicit-sharding mode.
    """
    if isinstance(spec, Mesh):
        return spec
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise SpecRagError("cannot build a mesh over zero devices")
    if spec is None:
        axes = {"model": len(devices)}
    else:
        axes = dict(spec) if isinstance(spec, dict) else parse_mesh_spec(spec)
    size = math.prod(axes.values())
    if size != len(devices):
        shape = ",".join(f"{k}={v}" for k, v in axes.items())
        raise SpecRagError(
            f"mesh {shape} needs {size} devices but {len(devices)} are given "
            f"({devices[0].platform}); make the axis sizes multiply to {len(devices)}"
        )
    if len({d.id for d in devices}) != len(devices):
        raise SpecRagError("a mesh cannot use the same device twice")
    grid = np.asarray(devices, dtype=object).reshape(tuple(axes.values()))
    return Mesh(grid, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def mesh_spec(mesh: Mesh) -> str:
    """The spec string of a mesh (``data=2,model=4``)."""
    return ",".join(f"{k}={v}" for k, v in mesh.shape.items())


def split_devices(devices: Sequence[jax.Device] | None, sizes: Sequence[int]) -> list[list[jax.Device]]:
    """Split devices into consecutive disjoint groups of the given sizes (e.g. 2 drafter + 6 verifier)."""
    devices = list(jax.devices() if devices is None else devices)
    if any(s < 1 for s in sizes):
        raise SpecRagError(f"every device group needs >= 1 device (got sizes {list(sizes)})")
    if sum(sizes) > len(devices):
        raise SpecRagError(
            f"device groups of sizes {list(sizes)} need {sum(sizes)} devices but only {len(devices)} are available"
        )
    out, start = [], 0
    for s in sizes:
        out.append(devices[start : start + s])
        start += s
    return out


def disjoint_meshes(
    specs: Sequence[str | dict[str, int] | None], sizes: Sequence[int], devices: Sequence[jax.Device] | None = None
) -> list[Mesh]:
    """One mesh per (spec, size) over consecutive disjoint device groups."""
    if len(specs) != len(sizes):
        raise SpecRagError("disjoint_meshes needs one spec per device group")
    return [make_mesh(spec, group) for spec, group in zip(specs, split_devices(devices, sizes))]
