"""Render docs/results.md and the README's results block from the result files in benchmarks/results/.

    python -m benchmarks.report            # write docs/results.md and the block between the README's markers
    python -m benchmarks.report --check    # write nothing; exit 1 with a line naming the file that differs

Every figure is read from a result file (``benchmarks/claims.py`` says which figures of which file back which
claim), and each section ends with the file's provenance: its command, commit, machine and date as the file
records them. Where a file records no commit or date, git's last commit of that file stands in, marked
"committed in" (the truth about when it was committed, not when it ran); where neither exists the field reads
"not recorded". Nothing here depends on the time of the rendering, so rendering twice gives the same bytes.

This module is the command and the README's markers; the rendering lives beside it: ``report_source`` (reading
result files), ``report_text`` (cells, tables, formats), ``report_provenance``, ``report_specs`` (the tables a
claim declares), ``report_eval_runs``, ``report_router`` (the router's tables and the README block) and
``report_page`` (docs/results.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from benchmarks.report_page import results_md, unclaimed
from benchmarks.report_provenance import provenance
from benchmarks.report_router import readme_block
from benchmarks.report_source import REPO_ROOT, RESULTS, ReportError, Source

__all__ = [
    "END",
    "README",
    "REPO_ROOT",
    "RESULTS",
    "RESULTS_MD",
    "START",
    "ReportError",
    "Source",
    "main",
    "provenance",
    "readme_block",
    "rendered",
    "results_md",
    "unclaimed",
    "with_readme_block",
]

RESULTS_MD = "docs/results.md"
README = "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def with_readme_block(readme: str, block: str) -> str:
    """``readme`` with the text between its markers replaced by ``block``."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise ReportError(f"{README}: the markers {START} ... {END} are missing")
    return readme[: start + len(START)] + "\n" + block + readme[end:]


def rendered(src: Source, root: Path = REPO_ROOT) -> dict[str, str]:
    """What each rendered file should hold: {repo-relative path: text}."""
    readme = (root / README).read_text()
    return {RESULTS_MD: results_md(src), README: with_readme_block(readme, readme_block(src))}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming a file that differs")
    args = ap.parse_args(argv)
    try:
        files = rendered(Source(REPO_ROOT / RESULTS))
    except ReportError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    for rel, text in files.items():
        path = REPO_ROOT / rel
        if path.read_text() == text:
            continue
        if args.check:
            print(f"report: {rel} differs from what benchmarks/results renders (run `make report`)", file=sys.stderr)
            return 1
        path.write_text(text)
        print(f"report: wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
