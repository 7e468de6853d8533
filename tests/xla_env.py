"""XLA flags of the test processes (this one and the subprocesses tests start).

The suite compiles with XLA's backend optimisation level 0 (``TEST_XLA_FLAGS``): the same programs (graph-level
passes such as fusion unchanged), lowered to machine code with less optimisation. Three quarters of the engine
and serving tests' time is tracing, lowering and compiling distinct small programs (a persistent cache found 36
of 401 of them already compiled), and level 0 cut the XLA compilation of four of those files by 30%. The CLI, the
server and the benchmarks keep XLA's defaults."""

from __future__ import annotations

import os

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def xla_flags(*extra: str) -> str:
    """``XLA_FLAGS`` for a test subprocess: this process's flags (the test flags among them) plus ``extra``."""
    own = os.environ.get("XLA_FLAGS", "").split()
    return " ".join([*own, *(flag for flag in extra if flag not in own)])


def use_test_flags() -> None:
    """Add ``TEST_XLA_FLAGS`` to this process's ``XLA_FLAGS`` (before JAX starts its backend)."""
    if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", "").split():
        os.environ["XLA_FLAGS"] = xla_flags(TEST_XLA_FLAGS)
