"""What a runner needs from a placement (a mesh + axis rules), as a protocol the models layer owns.

``specrag_jax.parallel.Placement`` implements it. The dependency points one way: ``parallel`` imports
``models`` (its rules map parameter paths and ``ModelConfig`` sizes to mesh axes), ``models`` imports only
this protocol and so never ``parallel``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
from jax.sharding import Mesh, NamedSharding

from specrag_jax.kernels import KVPool
from specrag_jax.kernels.metadata import AttentionMetadata
from specrag_jax.models.config import ModelConfig


@runtime_checkable
class StepPlacement(Protocol):
    """Shardings for one model's parameters, KV pool and step inputs over ``mesh``."""

    mesh: Mesh

    @property
    def replicated(self) -> NamedSharding:
        """The whole-on-every-device sharding (also the runner's ``device_put`` target)."""

    def param_shardings(self, cfg: ModelConfig, params: Any) -> Any:
        """A NamedSharding per parameter leaf."""

    def put_params(self, cfg: ModelConfig, params: Any) -> Any:
        """The parameter tree committed with its shardings."""

    def pool_shardings(self, cfg: ModelConfig, num_pages: int) -> KVPool:
        """The KV pool's per-layer shardings."""

    def make_pool(self, cfg: ModelConfig, num_pages: int, page_size: int, dtype: Any) -> KVPool:
        """A zero pool created directly in its sharding."""

    def token_sharding(self, num_tokens: int) -> NamedSharding:
        """Sharding of the packed-token arrays of a step."""

    def meta_shardings(self, meta: AttentionMetadata) -> AttentionMetadata:
        """Per-field shardings of a step's attention metadata."""

    def put(self, value: Any, sharding: NamedSharding) -> jax.Array:
        """A host-identical value placed with ``sharding`` (each process fills its own shards)."""
