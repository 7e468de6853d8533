"""Placement: a mesh + axis rules, turned into NamedShardings for one model's params, pool and steps.

``ModelRunner(..., placement=Placement(mesh))`` commits the parameters and the KV page pool with these
shardings and compiles its steps with explicit ``in_shardings``/``out_shardings`` (the pool keeps its
sharding across steps, so nothing recompiles or reshards between calls).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specrag_jax.kernels import KVPool, make_pool
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.models.config import ModelConfig
from specrag_jax.parallel.mesh import make_mesh, mesh_spec
from specrag_jax.parallel.rules import DEFAULT_RULES, MeshAxes, param_specs, pool_spec, resolve_spec

_TOKEN_FIELDS = ("token_seq", "positions", "parents", "token_valid", "write_slots")


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """Where one model lives: a mesh and the logical axis rules (see ``rules.py``)."""

    mesh: Mesh
    rules: Mapping[str, MeshAxes] = dataclasses.field(default_factory=lambda: dict(DEFAULT_RULES))

    @classmethod
    def from_spec(cls, spec: str | None = None, devices=None, **rule_overrides: MeshAxes) -> "Placement":
        """``Placement.from_spec("data=2,model=4")`` over ``devices`` (default: all)."""
        return cls(make_mesh(spec, devices), {**DEFAULT_RULES, **rule_overrides})

    @property
    def devices(self) -> list[jax.Device]:
        return list(self.mesh.devices.flat)

    @property
    def spec(self) -> str:
        return mesh_spec(self.mesh)

    def sharding(self, spec: P = P()) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    # ------------------------------------------------------------------ parameters and pool
    def param_shardings(self, cfg: ModelConfig, params: Any, replicated: list[str] | None = None) -> Any:
        specs = param_specs(cfg, params, self.mesh, self.rules, replicated)
        return jax.tree_util.tree_map(lambda s: NamedSharding(self.mesh, s), specs, is_leaf=lambda x: isinstance(x, P))

    def put_params(self, cfg: ModelConfig, params: Any) -> Any:
        """Commit a parameter tree with its shardings (works across processes: each fills its own shards)."""
        shardings = self.param_shardings(cfg, params)
        return jax.tree_util.tree_map(put_global, params, shardings)

    def pool_sharding(self, cfg: ModelConfig, num_pages: int) -> NamedSharding:
        return NamedSharding(self.mesh, pool_spec(cfg, num_pages, self.mesh, self.rules))

    def pool_shardings(self, cfg: ModelConfig, num_pages: int) -> KVPool:
        s = self.pool_sharding(cfg, num_pages)
        return KVPool(k=(s,) * cfg.num_layers, v=(s,) * cfg.num_layers)

    def make_pool(self, cfg: ModelConfig, num_pages: int, page_size: int, dtype) -> KVPool:
        """A zero pool created directly in its sharding (never whole on one device)."""
        fn = jax.jit(
            lambda: make_pool(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(dtype)),
            out_shardings=self.pool_shardings(cfg, num_pages),
        )
        return fn()

    # ------------------------------------------------------------------ activations
    def token_sharding(self, num_tokens: int) -> NamedSharding:
        """Packed-token arrays split over the ``batch`` rule's axes when the bucket divides (else whole)."""
        return NamedSharding(self.mesh, resolve_spec(("batch",), {"batch": num_tokens}, self.mesh, self.rules))

    def meta_shardings(self, meta: AttentionMetadata) -> AttentionMetadata:
        """Per-field shardings of a step's metadata: token arrays as ``token_sharding``, the rest whole."""
        tok = self.token_sharding(int(np.shape(meta.token_seq)[0]))
        fields = {
            f.name: (tok if f.name in _TOKEN_FIELDS else self.replicated)
            for f in dataclasses.fields(meta)
            if getattr(meta, f.name) is not None
        }
        return AttentionMetadata(**{**{"ancestors": None}, **fields})

    def put(self, value: Any, sharding: NamedSharding) -> jax.Array:
        """``put_global`` (the ``StepPlacement`` protocol's placement of step inputs)."""
        return put_global(value, sharding)

    def describe(self, cfg: ModelConfig, params: Any, num_pages: int) -> dict:
        """What is split and what is replicated (for logs and the collectives benchmark)."""
        notes: list[str] = []
        specs = param_specs(cfg, params, self.mesh, self.rules, notes)
        flat = {
            "/".join(str(getattr(k, "key", k)) for k in path): str(s)
            for path, s in jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, P))[0]
        }
        return {
            "mesh": self.spec,
            "params": flat,
            "kv_pool": str(pool_spec(cfg, num_pages, self.mesh, self.rules)),
            "replicated": sorted({re.sub(r"layers_\d+/", "layers_*/", n) for n in notes}),
        }


def put_global(value: Any, sharding: NamedSharding) -> jax.Array:
    """Place a host-identical value with ``sharding``; in multi-process runs each process fills its shards."""
    if isinstance(value, jax.Array) and value.is_fully_addressable and sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
