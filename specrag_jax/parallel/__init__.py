"""Scale-out with JAX's own runtime: meshes, logical axis rules, shardings, disjoint sub-meshes.

Multi-device checks on a CPU host: set ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX
starts, then ``python -m specrag_jax.parallel.checks``. The sharded dense index is ``parallel.dense``,
multi-process runs ``parallel.distributed``. Pallas attention under shard_map is ``kernels.sharded``.

Layering: ``parallel`` imports ``models`` (its axis rules and placements know ``ModelConfig`` and the
parameter tree) and ``models`` never imports ``parallel``: a runner is handed a placement and uses it
through the ``models.executor.placement_api.StepPlacement`` protocol, which ``Placement`` implements.
"""

from specrag_jax.parallel.cli import add_mesh_arguments, placement_from_args, placements_from_args
from specrag_jax.parallel.mesh import (
    disjoint_meshes,
    make_mesh,
    mesh_spec,
    parse_device_list,
    parse_mesh_spec,
    split_devices,
)
from specrag_jax.parallel.placement import Placement, put_global
from specrag_jax.parallel.rules import DEFAULT_RULES, param_specs, pool_spec, resolve_spec
from specrag_jax.parallel.submesh import ModelPlacements, drafter_verifier_placements, overlap_s, run_concurrently

__all__ = [
    "DEFAULT_RULES",
    "ModelPlacements",
    "Placement",
    "add_mesh_arguments",
    "drafter_verifier_placements",
    "overlap_s",
    "placement_from_args",
    "placements_from_args",
    "run_concurrently",
    "disjoint_meshes",
    "make_mesh",
    "mesh_spec",
    "param_specs",
    "parse_device_list",
    "parse_mesh_spec",
    "pool_spec",
    "put_global",
    "resolve_spec",
    "split_devices",
]
