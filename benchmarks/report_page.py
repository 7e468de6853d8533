"""docs/results.md: the index of sections, then each claim's tables and provenance, from benchmarks/claims.py."""

from __future__ import annotations

from typing import Sequence

from benchmarks.report_eval_runs import eval_run_lines
from benchmarks.report_provenance import provenance
from benchmarks.report_source import RESULTS, ReportError, Source
from benchmarks.report_specs import Claim, Section
from benchmarks.report_text import wrap


def claim_lines(src: Source, claim: Claim) -> list[str]:
    lines = [f"### {claim.title}", "", claim.backs, ""]
    if claim.eval_run:
        lines += [*eval_run_lines(src, claim.file), ""]
    for spec in claim.tables:
        lines += [*spec.render(src, claim.file), ""]
    line = provenance(src, claim.file).line(src.shown(claim.file))
    for extra in claim.extra_files:
        if not (src.dir / extra).exists():
            raise ReportError(f"{RESULTS}/{extra}: result file missing")
    if claim.extra_files:
        line += " With it: " + ", ".join(f"`{RESULTS}/{e}`" for e in claim.extra_files) + "."
    return lines + [line, ""]


def unclaimed(src: Source, sections: Sequence[Section]) -> list[str]:
    """Files under the results folder that no claim names (a claimed folder covers everything inside it)."""
    claimed = [src.dir / f for sec in sections for c in sec.claims for f in (c.file, *c.extra_files)]
    files = sorted(p for p in src.dir.rglob("*") if p.is_file())
    return [
        p.relative_to(src.dir).as_posix()
        for p in files
        if not any(p == c or (c.is_dir() and c in p.parents) for c in claimed)
    ]


def results_md(src: Source, sections: Sequence[Section] | None = None) -> str:
    if sections is None:
        from benchmarks.claims import SECTIONS

        sections = SECTIONS
    stray = unclaimed(src, sections)
    if stray:
        raise ReportError(
            f"{RESULTS}/{stray[0]}: backs no claim in benchmarks/claims.py ({len(stray)} such file(s)); "
            "add its claim or remove it"
        )
    lines = [
        "# Results",
        "",
        "<!-- Rendered by `python -m benchmarks.report` (`make report`) from benchmarks/results/: edit the result "
        "files or benchmarks/claims.py, never this file (tests/test_results_report.py fails when they differ). -->",
        "",
        "Every measured figure of this repository, read from its result file under `benchmarks/results/`. Each "
        "section ends with the file's command, commit, machine and date as the file records them; where a file "
        'records no commit or date, git\'s last commit of the file is given as "committed in" (when it was '
        'committed, not when it ran), and a field neither gives reads "not recorded". The scripts behind the '
        "files, and the claims each backs: [benchmarks.md](benchmarks.md). Unless a section says otherwise the "
        "models are the default pair (drafter SmolLM2-135M-Instruct with its shipped adapter, verifier "
        "Qwen2.5-Coder-1.5B-Instruct) on a 2-core CPU, and latencies exclude one-time compilation.",
        "",
    ]
    lines += ["| section | result files |", "|---|---|"]
    for sec in sections:
        files = ", ".join(f"`{c.file}`" for c in sec.claims)
        lines.append(f"| [{sec.title}](#{anchor(sec.title)}) | {files} |")
    lines.append("")
    for sec in sections:
        lines += [f"## {sec.title}", "", sec.intro, ""]
        for claim in sec.claims:
            lines += claim_lines(src, claim)
    return "\n".join(wrap(lines)).rstrip("\n") + "\n"


def anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return keep.replace(" ", "-")
