"""The executor: what runs model steps on device.

``runner`` (``ModelRunner``: parameters, the KV page pool and the jitted steps), ``packing`` (several sequences'
new tokens -> one bucketed step), ``step_export`` (steps stored as exported StableHLO, so a new process does not
trace them), ``kv_transfer`` (whole sequences' K/V between a pool and the host), ``placement_api`` (what a runner
needs of a placement; ``parallel.Placement`` implements it), ``cost`` (FLOPs and bytes a step must cost).
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "runner": ("ModelRunner",),
    "packing": ("Chunk", "PackedStep", "bucket", "pack_chunks", "token_count_bucket"),
    "step_export": ("ExportedSteps",),
    "kv_transfer": ("host_to_pool", "pool_to_host", "runner_read_kv", "runner_write_kv"),
    "placement_api": ("StepPlacement",),
    "cost": ("Cost", "ModelCost", "decode_cost", "prefill_cost", "tree_cost"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
