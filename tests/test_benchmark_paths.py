"""Benchmark results record portable paths: repo-relative, ../shared, ~ and $TMPDIR, never this machine's."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from benchmarks.common import REPO_ROOT, RESULTS_DIR, portable


def test_portable_rewrites_this_machines_paths():
    root = str(REPO_ROOT)
    payload = {
        "cwd": root,
        "out": f"{root}/benchmarks/results/x.json",
        "data": f"{REPO_ROOT.parent}/shared/d.jsonl",
        "command": f"python {root}/b.py --out={root}/o",
        "list": [f"{root}/a", 3, None],
        "other": "/opt/elsewhere",
        "ratio": 1.5,
    }
    assert portable(payload) == {
        "cwd": ".",
        "out": "benchmarks/results/x.json",
        "data": "../shared/d.jsonl",
        "command": "python b.py --out=o",
        "list": ["a", 3, None],
        "other": "/opt/elsewhere",
        "ratio": 1.5,
    }
    # home and the temporary folder, where the checkout is not inside them (the checkout's names come first)
    for base, short in ((Path.home(), "~"), (Path(tempfile.gettempdir()), "$TMPDIR")):
        if not str(REPO_ROOT.parent).startswith(str(base)):
            assert portable(f"{base}/x/y") == f"{short}/x/y"


def test_committed_results_hold_no_absolute_checkout_paths():
    files = sorted(RESULTS_DIR.rglob("*.json"))
    assert files
    for path in files:
        text = path.read_text()
        assert str(REPO_ROOT) not in text and str(REPO_ROOT.parent / "shared") not in text, path
        assert portable(json.loads(text)) == json.loads(text), path
