"""One real ``specrag eval`` run (SmolLM2 as drafter and verifier) whose output test_eval_cli.py checks.

Its users stay in that one file: `make test` runs each file on one of its workers, and a second file using the
run on the other worker would make it again (a minute of a cold run)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "pipeline" / "data" / "mini_eval.jsonl"
SMOL = "smollm2-135m-instruct"
# The public contract's five methods, lossless (its speculation contract) and auto (the router's report).
SMOL_EVAL_METHODS = ["closed_book", "standard", "speculative", "drafter_only", "random_draft", "lossless", "auto"]


@dataclass
class CliRun:
    code: int
    out: str
    err: str
    out_dir: Path


@pytest.fixture(scope="session")
def smol_eval(tmp_path_factory) -> CliRun:
    """``specrag eval --limit 2 --m 2 --json --out DIR`` on the two-question fixture with ``SMOL_EVAL_METHODS``."""
    from specrag_jax.cli import main

    out_dir = tmp_path_factory.mktemp("smol_eval")
    args = ["eval", "--data", str(DATA), "--methods", ",".join(SMOL_EVAL_METHODS), "--limit", "2"]
    args += ["--drafter", SMOL, "--verifier", SMOL, "--m", "2", "--json", "--out", str(out_dir)]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(args)
    return CliRun(code, out.getvalue(), err.getvalue(), out_dir)
