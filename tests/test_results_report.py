"""docs/results.md and the README's results block are what benchmarks/report.py renders from benchmarks/results/.

The rendering reads git for the provenance a result file does not record ("committed in"), so the comparisons need
the repository's history; they skip in a checkout without it (no git, a shallow clone).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.claims import SECTIONS
from benchmarks.report import END, README, RESULTS, RESULTS_MD, START, ReportError, Source

ROOT = report.REPO_ROOT


def _has_history() -> bool:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == "false"


needs_history = pytest.mark.skipif(not _has_history(), reason="provenance falls back to git history, absent here")


@pytest.fixture(scope="module")
def source() -> Source:
    return Source(ROOT / RESULTS)


def _block(readme: str) -> str:
    start, end = readme.index(START), readme.index(END)
    return readme[start + len(START) + 1 : end]


@needs_history
def test_committed_results_md_equals_the_rendering(source):
    rendered = report.results_md(source)
    committed = (ROOT / RESULTS_MD).read_text()
    assert committed == rendered, f"{RESULTS_MD} differs from what benchmarks/results renders: run `make report`"


@needs_history
def test_readme_results_block_equals_the_rendering(source):
    readme = (ROOT / README).read_text()
    assert START in readme and END in readme, f"{README}: the results markers are missing"
    assert _block(readme) == report.readme_block(source), (
        f"{README}'s results block differs from what benchmarks/results renders: run `make report`"
    )


def test_every_number_in_the_readme_table_is_in_results_md(source):
    """The README's tables are docs/results.md's (the router's section renders the same two tables)."""
    block = report.readme_block(source)
    tables = [line for line in block.splitlines() if line.startswith("|")]
    assert len(tables) >= 8
    results_md = report.results_md(source)
    for line in tables:
        assert line in results_md, line


def test_every_result_file_backs_a_claim(source):
    assert report.unclaimed(source, SECTIONS) == []
    files = [c.file for sec in SECTIONS for c in sec.claims]
    assert len(files) == len(set(files)), "a result file has two sections"


def _copy(tmp_path: Path, *names: str) -> Path:
    results = tmp_path / "results"
    for name in names:
        src = ROOT / RESULTS / name
        dst = results / name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    return results


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


LONG = "long_context.json"
DEV = "eval_dev100_auto"


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        (LONG, lambda d: d.pop("machine"), f"{LONG}: missing key 'machine'"),
        (LONG, lambda d: d.pop("command"), f"{LONG}: missing key 'command'"),
        (LONG, lambda d: d["sizes"][3].pop("n_docs"), f"{LONG}: sizes/3: missing key 'n_docs'"),
        (DEV, lambda d: d["config"].pop("command"), f"{DEV}/results.json: missing key 'command'"),
    ],
)
def test_a_missing_required_key_fails_naming_file_and_key(tmp_path, name, edit, message):
    results = _copy(tmp_path, "eval_dev100_auto", "long_context.json")
    target = results / name
    _edit(target / "results.json" if target.is_dir() else target, edit)
    with pytest.raises(ReportError) as err:
        report.readme_block(Source(results, repo_root=None))
    assert message in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_provenance_not_recorded_without_git(tmp_path):
    """An eval run records its command but no commit, machine or date: shown as not recorded, never invented."""
    src = Source(_copy(tmp_path, "eval_dev100_auto"), repo_root=None)
    p = report.provenance(src, "eval_dev100_auto")
    assert p.command.startswith("specrag eval ")
    assert (p.commit, p.machine, p.date) == ("not recorded",) * 3


def test_a_result_file_without_a_claim_fails(tmp_path, source):
    results = tmp_path / "results"
    shutil.copytree(ROOT / RESULTS, results, symlinks=True)
    (results / "stray.json").write_text("{}")
    with pytest.raises(ReportError, match=r"benchmarks/results/stray.json: backs no claim"):
        report.results_md(Source(results, repo_root=None))


def test_check_names_the_drifted_file_and_writes_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / RESULTS).symlink_to(ROOT / RESULTS, target_is_directory=True)
    (tmp_path / README).write_text((ROOT / README).read_text())
    (tmp_path / RESULTS_MD).write_text("# Results\n\nhand-typed\n")
    monkeypatch.setattr(report, "REPO_ROOT", tmp_path)
    assert report.main(["--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert RESULTS_MD in err
    assert (tmp_path / RESULTS_MD).read_text() == "# Results\n\nhand-typed\n"
