"""Multi-device checks run in subprocesses: the forced host device count must be set before JAX starts,
and the rest of the suite runs in one process with one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.xla_env import xla_flags

ROOT = Path(__file__).resolve().parents[2]


def run_json(args: list[str], devices: int = 8, timeout: int = 600, env: dict | None = None) -> dict:
    """Run ``python args`` with ``devices`` host CPU devices; the last stdout line that is a JSON object."""
    full_env = {
        **os.environ,
        "XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={devices}"),
        "JAX_PLATFORMS": "cpu",
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1])


@pytest.fixture(scope="session")
def multidevice() -> dict:
    """One 8-device subprocess running the fast checks (tiny models, Pallas shard_map, index, sub-meshes)."""
    return run_json(["-m", "specrag_jax.parallel.checks", "tiny", "pallas", "dense", "submeshes", "collectives"])
