"""What a result file records about the run that made it: the machine, the commit and the time (``specrag eval``'s
``config.run``; the benchmarks' run header reads the same machine facts)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

_CHECKOUT = Path(__file__).resolve().parent.parent


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 2)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """CPU count (visible and affinity), CPU model, total memory, OS and Python."""
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gb": _mem_total_gb(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def checkout_commit() -> str | None:
    """The commit of the checkout the package runs from (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_CHECKOUT, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_facts() -> dict[str, Any]:
    """``timestamp_utc``, ``machine`` and ``git.commit`` of this run (the benchmarks' header fields)."""
    return {
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "git": {"commit": checkout_commit()},
    }
