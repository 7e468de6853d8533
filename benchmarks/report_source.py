"""Reading the result files for the report: each file once, paths into its JSON, git for missing provenance."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = "benchmarks/results"  # repo-relative: how the rendered text names result files


class ReportError(Exception):
    """A result file cannot be rendered (missing, unreadable, or without a key a claim needs)."""


class Source:
    """The result files under ``results_dir``, each read once; git (at ``repo_root``) for missing provenance."""

    def __init__(self, results_dir: Path, repo_root: Path | None = REPO_ROOT) -> None:
        self.dir = Path(results_dir)
        self.repo_root = repo_root
        self._json: dict[str, Any] = {}

    def path(self, name: str) -> Path:
        """A result file by its name under the results folder; a folder means its ``results.json``."""
        p = self.dir / name
        return p / "results.json" if p.is_dir() else p

    def shown(self, name: str) -> str:
        """How the rendered text names a result file: repo-relative, under benchmarks/results."""
        return f"{RESULTS}/{self.path(name).relative_to(self.dir).as_posix()}"

    def json(self, name: str) -> Any:
        if name not in self._json:
            p = self.path(name)
            try:
                self._json[name] = json.loads(p.read_text())
            except FileNotFoundError:
                raise ReportError(f"{self.shown(name)}: result file missing") from None
            except json.JSONDecodeError as exc:
                raise ReportError(f"{self.shown(name)}: not valid JSON ({exc})") from None
        return self._json[name]

    def jsonl(self, name: str) -> list[dict]:
        p = self.dir / name
        try:
            return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        except FileNotFoundError:
            raise ReportError(f"{RESULTS}/{name}: result file missing") from None

    def committed(self, name: str) -> tuple[str, str] | None:
        """(commit, date) of git's last commit of the file, or None (no git, not committed, shallow history)."""
        if self.repo_root is None:
            return None
        try:
            rel = self.path(name).resolve().relative_to(self.repo_root.resolve())
            out = subprocess.run(
                ["git", "log", "-1", "--format=%H %cs", "--", rel.as_posix()],
                cwd=self.repo_root,
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.split()
        except (ValueError, OSError, subprocess.SubprocessError):
            return None
        return (out[0][:7], out[1]) if len(out) == 2 else None


def get(data: Any, path: str, where: str) -> Any:
    """``data`` at ``path`` ("a/b/0/c": dict keys and list indexes). Alternatives "x|y" take the first present;
    a leading "?" makes the path optional (None when missing). A missing required path is a ReportError."""
    optional = path.startswith("?")
    alternatives = path.lstrip("?").split("|")
    for alt in alternatives:
        cur, found = data, True
        for part in alt.split("/") if alt else []:
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
                cur = cur[int(part)]
            else:
                found = False
                break
        if found:
            return cur
    if optional:
        return None
    raise ReportError(f"{where}: missing key {' or '.join(repr(a) for a in alternatives)}")
