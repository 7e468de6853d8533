"""This machine's peak matmul rate and memory bandwidth, measured now (the roofline's denominators).

Measured in the same process as the work they judge, so a busy or throttled machine lowers both sides. The
matmul is a float32 [512, 1536] x [1536, 8960] product (a Qwen2.5-1.5B MLP projection of one 512-token prefill
chunk), the bandwidth a jitted sum over a 256 MiB float32 array; both best of ``repeats``. About a second.
Published peaks of accelerators (``DEVICE_PEAKS``) turn the same FLOP and byte counts into predictions.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

# Published dense peaks: H200 SXM (NVIDIA datasheet: 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e) and
# TPU v5e (Google Cloud: 197 TFLOP/s bf16, 819 GB/s HBM2e), per chip.
DEVICE_PEAKS = {
    "h200": {"flops_per_s": 989e12, "bytes_per_s": 4.8e12, "dtype": "bfloat16"},
    "tpu-v5e": {"flops_per_s": 197e12, "bytes_per_s": 819e9, "dtype": "bfloat16"},
}
# Accelerators named by their JAX ``device_kind`` (a substring, lower case) -> DEVICE_PEAKS name; H100 SXM's
# datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3.
DEVICE_KINDS = {"h200": "h200", "h100": "h100", "tpu v5 lite": "tpu-v5e", "tpu v5e": "tpu-v5e"}
ACCELERATOR_PEAKS = {"h100": {"flops_per_s": 989e12, "bytes_per_s": 3.35e12, "dtype": "bfloat16"}}


@dataclasses.dataclass(frozen=True)
class MachinePeaks:
    flops_per_s: float
    bytes_per_s: float
    source: str  # "measured" or a DEVICE_PEAKS name

    def to_dict(self) -> dict:
        return {
            "matmul_gflops": round(self.flops_per_s / 1e9, 1),
            "bandwidth_gbps": round(self.bytes_per_s / 1e9, 2),
            "source": self.source,
        }


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Fastest wall time of ``fn`` over ``repeats`` calls."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_peaks(repeats: int = 5, m: int = 512, k: int = 1536, n: int = 8960, mib: int = 256) -> MachinePeaks:
    """Best-of-``repeats`` float32 matmul FLOP/s and read bandwidth of the default JAX device."""
    a = jnp.ones((m, k), jnp.float32)
    b = jnp.ones((k, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile
    t_mm = best_time(lambda: matmul(a, b).block_until_ready(), repeats)
    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    t_bw = best_time(lambda: total(x).block_until_ready(), repeats)
    return MachinePeaks(2.0 * m * k * n / t_mm, x.nbytes / t_bw, "measured")


@functools.lru_cache(maxsize=1)
def peaks_once() -> MachinePeaks:
    """``measure_peaks`` once per process (an eval measures at its first question, ask after its answer)."""
    return measure_peaks()


def device_peaks(name: str) -> MachinePeaks:
    """Published peaks of an accelerator in ``DEVICE_PEAKS`` (or ``ACCELERATOR_PEAKS``)."""
    p = {**ACCELERATOR_PEAKS, **DEVICE_PEAKS}[name]
    return MachinePeaks(p["flops_per_s"], p["bytes_per_s"], name)


def platform_peaks() -> MachinePeaks:
    """The running platform's peaks: this machine's measured ones on a CPU (or an accelerator without published
    figures here), an accelerator's published ones when its ``device_kind`` is in ``DEVICE_KINDS``."""
    if jax.default_backend() != "cpu":
        kind = jax.devices()[0].device_kind.lower()
        for key, name in DEVICE_KINDS.items():
            if key in kind:
                return device_peaks(name)
    return peaks_once()
