"""Multi-process JAX (one process per host, or several local ones): ``jax.distributed`` with a global mesh.

``python -m specrag_jax.parallel.distributed --coordinator 127.0.0.1:PORT --num-processes 2 --process-id I``
runs a tiny model's sharded forward over the devices of all processes and prints its logits (process 0) as
JSON; the test launches two such local processes (CPU collectives: gloo) and compares with one process.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np


def initialize(coordinator: str, num_processes: int, process_id: int, *, cpu_collectives: str = "gloo") -> None:
    """``jax.distributed.initialize`` (call before anything touches devices); CPU hosts need collectives."""
    if jax.config.jax_cpu_collectives_implementation in (None, "none", ""):
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def sharded_forward_logits(spec: str, seed: int = 3, placement=None) -> np.ndarray:
    """Logits of a fixed prefill + tree step of the tiny Llama (``checks.tiny``) under ``spec`` (None: 1 device)."""
    from specrag_jax.models.decoder.transformer import init_params
    from specrag_jax.models.executor.packing import Chunk
    from specrag_jax.models.executor.runner import ModelRunner
    from specrag_jax.parallel.checks import TREE, tiny
    from specrag_jax.parallel.placement import Placement

    cfg = tiny("llama")
    if placement is None and spec:
        placement = Placement.from_spec(spec)
    runner = ModelRunner(
        cfg, init_params(cfg, seed=seed), num_pages=8, page_size=16, max_seq_len=64, placement=placement
    )
    pages = runner.allocator.allocate(2)
    prefill = runner.logits(runner.pack([Chunk(pages, 0, list(range(3, 23)), rows=[0, 19])]))
    tree = Chunk(
        pages,
        20,
        TREE["tokens"],
        parents=TREE["parents"],
        positions=[20 + p for p in TREE["positions"]],
        write=False,
        rows=list(range(6)),
    )
    return np.concatenate([prefill, runner.logits(runner.pack([tree]))])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="one process of a multi-process sharded forward")
    parser.add_argument("--coordinator", required=True, help="host:port of process 0")
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--mesh", default="data=2,model=2")
    args = parser.parse_args(argv)
    initialize(args.coordinator, args.num_processes, args.process_id)
    logits = sharded_forward_logits(args.mesh)
    if args.process_id == 0:
        print(
            json.dumps(
                {
                    "process_count": jax.process_count(),
                    "devices": len(jax.devices()),
                    "local_devices": len(jax.local_devices()),
                    "logits": logits.tolist(),
                }
            )
        )
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
