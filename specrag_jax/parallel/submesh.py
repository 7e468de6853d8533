"""Drafter and verifier on disjoint sub-meshes of one device set, and running their work concurrently.

JAX dispatch is asynchronous and each jitted step runs on its own mesh's devices, so two host threads
that dispatch to disjoint device groups keep both groups busy at once (drafting the next question while
verifying the current one, as production deployments split e.g. 2 drafter devices and 6 verifier ones).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

import jax

from specrag_jax.errors import SpecRagError
from specrag_jax.parallel.mesh import make_mesh, split_devices
from specrag_jax.parallel.placement import Placement


@dataclasses.dataclass(frozen=True)
class ModelPlacements:
    """Where the drafter and the verifier live (None = the default single device)."""

    drafter: Placement | None = None
    verifier: Placement | None = None

    def disjoint(self) -> bool:
        if self.drafter is None or self.verifier is None:
            return False
        return not {d.id for d in self.drafter.devices} & {d.id for d in self.verifier.devices}


def drafter_verifier_placements(
    drafter_devices: int,
    verifier_devices: int,
    *,
    drafter_spec: str | None = None,
    verifier_spec: str | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> ModelPlacements:
    """Split the first ``drafter_devices + verifier_devices`` devices into two disjoint meshes.

    A spec of None puts all of a group's devices on ``model`` (tensor parallel).
    """
    d_devs, v_devs = split_devices(devices, [drafter_devices, verifier_devices])
    return ModelPlacements(Placement(make_mesh(drafter_spec, d_devs)), Placement(make_mesh(verifier_spec, v_devs)))


@dataclasses.dataclass
class TimedResult:
    value: Any
    start: float
    end: float


def run_concurrently(*fns: Callable[[], Any]) -> list[TimedResult]:
    """Run each function on its own thread; results with start/end times (perf_counter), in order.

    An exception in any function is re-raised here (the first one, after every thread has finished).
    """
    results: list[TimedResult | None] = [None] * len(fns)
    errors: list[BaseException] = []

    def work(i: int, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            value = fn()
            jax.block_until_ready(value)
        except BaseException as exc:  # every failure, KeyboardInterrupt too: re-raised in the caller's thread
            errors.append(exc)
            return
        results[i] = TimedResult(value, t0, time.perf_counter())

    threads = [threading.Thread(target=work, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if any(r is None for r in results):
        raise SpecRagError("a concurrent task ended without a result")
    return results  # type: ignore[return-value]


def overlap_s(a: TimedResult, b: TimedResult) -> float:
    """Seconds during which both tasks were running."""
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))
