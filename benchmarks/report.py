"""Render docs/results.md and the README's results block from the result files in benchmarks/results/.

    python -m benchmarks.report            # write docs/results.md and the block between the README's markers
    python -m benchmarks.report --check    # write nothing; exit 1 with a line naming the file that differs

Every figure is read from a result file (``benchmarks/claims.py`` says which figures of which file back which
claim), and each section ends with the file's provenance: its command, commit, machine and date as the file
records them. Where a file records no commit or date, git's last commit of that file stands in, marked
"committed in" (the truth about when it was committed, not when it ran); where neither exists the field reads
"not recorded". Nothing here depends on the time of the rendering, so rendering twice gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = "benchmarks/results"  # repo-relative: how the rendered text names result files
RESULTS_MD = "docs/results.md"
README = "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
NOT_RECORDED = "not recorded"
DASH = "–"


class ReportError(Exception):
    """A result file cannot be rendered (missing, unreadable, or without a key a claim needs)."""


# ----------------------------------------------------------------------------------------------- reading files
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


# ------------------------------------------------------------------------------------------------- formatting
def fmt(value: Any, spec: str | Callable[[Any], str] = "{}") -> str:
    """One table cell: ``spec`` is a str.format pattern or a function; None (not recorded) is a dash."""
    if value is None:
        return DASH
    if callable(spec):
        return spec(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return spec.format(value)


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def wrap(lines: Sequence[str], width: int = 120) -> list[str]:
    """Prose lines filled to ``width`` (tables, headings and comments stay one line each)."""
    out: list[str] = []
    for line in lines:
        if not line or line.startswith(("|", "#", "<!--")):
            out.append(line)
        else:
            out += textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)
    return out


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def machine_text(machine: Any) -> str:
    if isinstance(machine, str):
        return machine
    if "cpu_model" not in machine:
        return ", ".join(f"{k} {v}" for k, v in machine.items())
    parts = [str(machine.get("cpu_model") or "CPU model not recorded")]
    if machine.get("nproc"):
        parts.append(f"{machine['nproc']} cores")
    if machine.get("mem_total_gb"):
        parts.append(f"{machine['mem_total_gb']:g} GB RAM")
    return ", ".join(parts)


@dataclass(frozen=True)
class Provenance:
    command: str
    commit: str
    machine: str
    date: str

    def line(self, shown: str) -> str:
        return (
            f"Result file `{shown}`; command `{self.command}`; commit {self.commit}; machine: {self.machine}; "
            f"date: {self.date}."
        )


def provenance(src: Source, name: str) -> Provenance:
    """The file's own command, commit, machine and date. ``command`` is required of every file, and a file with a
    run header (``timestamp_utc``) must also record ``machine`` and ``git/commit``; the rest may be missing."""
    data, where = src.json(name), src.shown(name)
    command = get(data, "command|config/command", where)
    if "timestamp_utc" in data:
        get(data, "machine", where)
        get(data, "git/commit", where)
    recorded_commit = get(data, "?git/commit|config/run/git/commit", where)
    recorded_date = get(data, "?timestamp_utc|config/run/timestamp_utc", where)
    machine = get(data, "?machine|hardware|config/run/machine", where)
    committed = src.committed(name) if not (recorded_commit and recorded_date) else None
    commit = f"`{recorded_commit[:7]}`" if recorded_commit else NOT_RECORDED
    date = recorded_date[:10] if recorded_date else NOT_RECORDED
    if committed and not recorded_commit:
        commit = f"{NOT_RECORDED} (the file was committed in `{committed[0]}`)"
    if committed and not recorded_date:
        date = f"{NOT_RECORDED} (committed {committed[1]})"
    return Provenance(command, commit, machine_text(machine) if machine else NOT_RECORDED, date)


# ----------------------------------------------------------------------------------------------- table specs
@dataclass(frozen=True)
class Figures:
    """A two-column table of single figures: (label, path, format)."""

    rows: tuple[tuple[str, str, Any], ...]
    caption: str = ""

    def render(self, src: Source, name: str) -> list[str]:
        data, where = src.json(name), src.shown(name)
        body = [(label, fmt(get(data, path, where), spec)) for label, path, spec in self.rows]
        return _captioned(self.caption, table(("figure", "value"), body))


@dataclass(frozen=True)
class Rows:
    """One row per entry of the dict or list at ``over``: the key (dicts) then ``cols`` (header, path, format)
    read inside the entry (an empty path: the entry itself); ``keys`` picks and orders a dict's entries (each one
    required), else every entry is a row (entries that are not dicts skipped when every column reads inside one)."""

    over: str
    cols: tuple[tuple[str, str, Any], ...]
    key: str | None = ""
    keys: tuple[str, ...] = ()
    caption: str = ""
    when: Callable[[Any], bool] | None = None  # keeps an entry (after ``keys``)

    def render(self, src: Source, name: str) -> list[str]:
        data, where = src.json(name), src.shown(name)
        entries = get(data, self.over, where)
        if isinstance(entries, dict):
            items = [(k, get(entries, k, f"{where}: {self.over}")) for k in self.keys] or list(entries.items())
            if not self.keys and all(path for _, path, _ in self.cols):  # entries to read into: only dicts
                items = [(k, e) for k, e in items if isinstance(e, dict)]
        else:
            items = [(str(i), e) for i, e in enumerate(entries)]
        if self.when is not None:
            items = [(k, e) for k, e in items if self.when(e)]
        header = ([self.key] if self.key is not None else []) + [c[0] for c in self.cols]
        body = []
        for k, entry in items:
            at = f"{where}: {self.over}/{k}"
            row = [fmt(get(entry, path, at), spec) for _, path, spec in self.cols]
            body.append(([k] if self.key is not None else []) + row)
        return _captioned(self.caption, table(header, body))


@dataclass(frozen=True)
class Custom:
    """Lines from a function of (source, file name)."""

    fn: Callable[[Source, str], list[str]]

    def render(self, src: Source, name: str) -> list[str]:
        return self.fn(src, name)


def _captioned(caption: str, lines: list[str]) -> list[str]:
    return ([caption, ""] if caption else []) + lines


@dataclass(frozen=True)
class Claim:
    """One result file and the claim it backs: its section in docs/results.md."""

    file: str  # under benchmarks/results; a folder is an eval run (its results.json)
    title: str
    backs: str  # what the figures show and where it is claimed
    tables: tuple = ()
    eval_run: bool = False  # render the generic table of an eval run (methods, split, config)
    extra_files: tuple[str, ...] = field(default=())  # further files of the same claim (listed, not rendered)


@dataclass(frozen=True)
class Section:
    title: str
    intro: str
    claims: tuple[Claim, ...]


# ----------------------------------------------------------------------------------------------- eval runs
def pct(x: float) -> str:
    return f"{x:.1%}"


def secs(x: float) -> str:
    return f"{x:.2f} s"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def points(x: float) -> str:
    """Points one question is worth: "1 point", "3.3 points"."""
    text = f"{x:.1f}".removesuffix(".0")
    return f"{text} point" + ("" if text == "1" else "s")


def split_breakdown(src: Source, name: str, methods: Sequence[str]) -> dict[str, dict[str, tuple]]:
    """Per method: (n, accuracy, mean latency) on the held-out and train parts of a ``--split all`` run, from its
    predictions (the split depends only on each row's question_id and data_source)."""
    from specrag_jax.evaluation.holdout import split_rows

    res, where = src.json(name), src.shown(name)
    fraction = get(res, "?config/holdout_fraction", where) or 0.3
    preds = src.jsonl(f"{name}/predictions.jsonl")
    questions = list({p["question_id"]: p for p in preds}.values())
    held = {r["question_id"] for r in split_rows(questions, "heldout", fraction)}
    out: dict[str, dict[str, tuple]] = {}
    for m in methods:
        out[m] = {}
        for part, keep in (("heldout", True), ("train", False)):
            rows = [p for p in preds if p["method"] == m and (p["question_id"] in held) == keep]
            if not rows:
                raise ReportError(f"{src.shown(name)}: no {m} predictions on the {part} split")
            acc = sum(bool(p["correct"]) for p in rows) / len(rows)
            out[m][part] = (len(rows), acc, statistics.fmean(p["latency_s"] for p in rows))
    return out


def eval_run_lines(src: Source, name: str) -> list[str]:
    res, where = src.json(name), src.shown(name)
    methods = get(res, "methods", where)
    rows = []
    for m, r in methods.items():
        at = f"{where}: methods/{m}"
        acc_right = get(r, "?cascade/accepted", at)
        cascade = (
            f"{acc_right} accepted ({fmt(get(r, '?cascade/accepted_accuracy', at), pct)} right), "
            f"{get(r, 'cascade/fallback', at)} fell back"
            if acc_right is not None
            else DASH
        )
        paths = get(r, "?router/paths", at)
        rows.append(
            [
                m,
                get(r, "n", at),
                fmt(get(r, "accuracy", at), pct),
                " / ".join(fmt(get(r, f"latency_s/{k}", at), "{:.2f}") for k in ("mean", "median", "p95")),
                fmt(get(r, "?tokens/per_question", at), "{:,.0f}"),
                fmt(get(r, "?speculation/accepted_tokens_per_step", at), "{:.2f}"),
                ", ".join(f"{k} {v}" for k, v in paths.items()) if paths else cascade,
            ]
        )
    header = ("method", "n", "accuracy", "latency mean / median / p95 (s)", "tokens per question",
              "tokens per verifier step", "cascade or route")  # fmt: skip
    lines = table(header, rows)
    config = get(res, "?config", where) or {}
    keys = ("split", "limit", "drafter", "drafter_adapter", "verifier", "n_docs", "m", "k", "selection", "tau_min",
            "clustering", "tree_budget")  # fmt: skip
    shown = [f"{k} {config[k]}" for k in keys if config.get(k) is not None]
    if shown:
        lines += ["", "Settings: " + ", ".join(shown) + "."]
    if config.get("split") == "all":
        parts = split_breakdown(src, name, list(methods))
        body = []
        for m, by in parts.items():
            body.append([m] + [f"{fmt(a, pct)} / {secs(t)} (n={n})" for n, a, t in (by["heldout"], by["train"])])
        lines += ["", *table(("method", "held-out: accuracy / mean latency", "train: accuracy / mean latency"), body)]
    selection = get(res, "?selection", where)
    if selection:
        lines += ["", "Selection alone on the same drafts: " + ", ".join(f"{k} {fmt(v, pct)}" for k, v in
                                                                        selection.items()) + "."]  # fmt: skip
    drafts = get(res, "?drafts", where)
    if drafts:
        lines += [
            "",
            f"Drafts: {get(drafts, 'n', where)}, right {fmt(get(drafts, 'correct', where), pct)}, following the "
            f"format {fmt(get(drafts, '?follows_format', where), pct)}.",
        ]
    return lines


# ------------------------------------------------------------------------------------ the router's two tables
DEV_RUN = "eval_dev100_auto"
LONG_RUN = "long_context.json"


def router_dev_lines(src: Source, name: str = DEV_RUN) -> list[str]:
    """The dev-100 table of standard against auto (the README's and docs/results.md's)."""
    res, where = src.json(name), src.shown(name)
    std, auto = get(res, "methods/standard", where), get(res, "methods/auto", where)
    preds = src.jsonl(f"{name}/predictions.jsonl")
    answers = {p["question_id"]: p["answer"] for p in preds if p["method"] == "auto"}
    same = sum(answers.get(p["question_id"]) == p["answer"] for p in preds if p["method"] == "standard")
    n = get(std, "n", where)
    parts = split_breakdown(src, name, ["standard", "auto"])
    router = get(auto, "router", where)
    lat_s, lat_a = get(std, "latency_s/mean", where), get(auto, "latency_s/mean", where)
    rows = [
        [f"dev {n} accuracy", fmt(get(std, "accuracy", where), "{:.0%}"),
         f"{fmt(get(auto, 'accuracy', where), '{:.0%}')} (answers identical on {same} of {n})", ""],
        [f"dev {n} mean latency", secs(lat_s), secs(lat_a), f"**{lat_a / lat_s:.3f}x**"],
    ]  # fmt: skip
    for part, label in (("heldout", "held-out"), ("train", "train")):
        (ns, acc_s, t_s), (_, acc_a, t_a) = parts["standard"][part], parts["auto"][part]
        rows.append([f"{label} {ns} accuracy / latency", f"{pct(acc_s)} / {secs(t_s)}", f"{pct(acc_a)} / {secs(t_a)}",
                     f"{t_a / t_s:.3f}x"])  # fmt: skip
    paths = get(router, "paths", where)
    rows.append(["paths", "", ", ".join(f"{k} {v}" for k, v in paths.items()), ""])
    predicted = get(router, "predicted_s_mean", where) / get(router, "measured_s_mean", where)
    rows.append(["exact path", "",
                 f"{get(auto, 'speculation/accepted_tokens_per_step', where):.2f} tokens per verifier step; "
                 f"predicted time {predicted:.2f}x the measured", ""])  # fmt: skip
    return table(("", "standard", "auto", "auto / standard"), rows)


def _route(entry: dict, where: str) -> str:
    paths = ", ".join(f"{k} {v}" for k, v in get(entry, "paths", where).items() if v)
    return paths


def long_context_lines(src: Source, name: str = LONG_RUN) -> list[str]:
    """Accuracy / mean latency per context size, and the route each platform's prediction takes."""
    data, where = src.json(name), src.shown(name)
    rows = []
    for i, s in enumerate(get(data, "sizes", where)):
        at = f"{where}: sizes/{i}"
        std_t = get(s, "standard/latency_s", at)

        def acc_lat(key: str, with_ratio: bool, bold: bool = False) -> str:
            a, t = get(s, f"{key}/accuracy", at), get(s, f"{key}/latency_s", at)
            text = f"{a:.0%} / {t:.1f} s"
            if with_ratio:
                r = f"{t / std_t:.2f}x"
                text += f" (**{r}**)" if bold else f" ({r})"
            return text

        route = get(s, "auto/router", at)
        devices = get(s, "auto/router_on_devices", at)
        dev_cells = []
        for dev, unit in (("h200", "{:.1f}"), ("tpu-v5e", "{:.0f}")):
            d = get(devices, dev, at)
            dev_cells.append(
                f"{_route(d, at)}: {unit.format(get(d, 'predicted_exact_ms', at))} vs "
                f"{unit.format(get(d, 'predicted_cascade_ms', at))} ms ({get(d, 'break_even_accept', at):.2f})"
            )
        rows.append(
            [
                get(s, "n_docs", at),
                f"{get(s, 'standard_prompt_tokens', at):.0f}",
                acc_lat("standard", False),
                acc_lat("auto", True, bold=True),
                acc_lat("speculative", True),
                f"{_route(route, at)} (break-even {get(route, 'break_even_accept_mean', at):.2f})",
                *dev_cells,
            ]
        )
    header = (
        "passages",
        "standard prompt tokens",
        "standard",
        "auto",
        "the cascade",
        "CPU route (break-even P(accept))",
        "H200 route: exact vs cascade predicted (break-even)",
        "TPU v5e route (break-even)",
    )
    return table(header, rows)


def long_context_summary(src: Source, name: str = LONG_RUN) -> str:
    """One paragraph of the long-context run's findings, every number read from the file."""
    data, where = src.json(name), src.shown(name)
    sizes = get(data, "sizes", where)
    ratios = [get(s, "auto/ratio_vs_standard", where) for s in sizes]
    last = sizes[-1]
    at = f"{where}: sizes/{len(sizes) - 1}"
    prefill = get(last, "roofline/auto/exact.prefill/measured_s", at)
    exact = get(last, "roofline/auto/exact/measured_s", at)
    cascade = get(last, "speculative/cascade", at)
    route = get(last, "auto/router", at)
    device_even = [
        get(s, f"auto/router_on_devices/{d}/break_even_accept", where) for s in sizes for d in ("h200", "tpu-v5e")
    ]
    exact_everywhere = all(get(s, "auto/router/paths/cascade", where) == 0 for s in sizes)
    return (
        f"`auto` ran at {min(ratios):.2f}-{max(ratios):.2f}x standard's latency"
        + (" and took the exact path on every question at every size" if exact_everywhere else "")
        + f". At {get(last, 'n_docs', at)} passages the exact path's prefill was {prefill:.1f} of its {exact:.1f} s "
        f"({prefill / exact:.0%}), which lossless decoding cannot shorten; the cascade accepted "
        f"{get(cascade, 'accepted', at)} of {get(cascade, 'n', at)} drafts (oracle "
        f"{get(last, 'selection/oracle', at):.0%}), and the predicted P(accept) was "
        f"{get(route, 'mean_acceptance/accept', at):.2f} against a CPU break-even of "
        f"{get(route, 'break_even_accept_mean', at):.2f}. The same prompts on an H200 and a TPU v5e (published "
        f"peaks, stage ratios 1.0) route to the exact path too, at a break-even acceptance of "
        f"{min(device_even):.2f}-{max(device_even):.2f}."
    )


def _run_facts(src: Source, name: str) -> str:
    p = provenance(src, name)
    return f"`{p.command}`; machine: {p.machine}; commit {p.commit}; date: {p.date}"


def readme_block(src: Source) -> str:
    """The README's results block, between the markers (markers excluded)."""
    dev_where, long_where = src.shown(DEV_RUN), src.shown(LONG_RUN)
    n = get(src.json(DEV_RUN), "methods/standard/n", dev_where)
    held = split_breakdown(src, DEV_RUN, ["standard"])["standard"]["heldout"][0]
    data = src.json(LONG_RUN)
    sizes = get(data, "sizes", long_where)
    first, last = (get(sizes, i, long_where) for i in ("0", "-1"))
    lines = [
        f"**Dev {n}, one run** ({_run_facts(src, DEV_RUN)}; latency without one-time compilation; one question is "
        f"{points(100 / n)} on dev {n}, {points(100 / held)} on the held-out {held}):",
        "",
        *router_dev_lines(src),
        "",
        f"**Long context, one run** ({_run_facts(src, LONG_RUN)}: {len(get(data, 'questions', long_where))} held-out "
        f"questions, each retrieving its top {get(first, 'n_docs', f'{long_where}: sizes/0')} to "
        f"{get(last, 'n_docs', f'{long_where}: sizes/{len(sizes) - 1}')} passages by BM25 from the dev file's "
        f"{get(data, 'corpus_passages', long_where):,} pooled passages; one question is "
        f"{points(get(data, 'one_question_points', long_where))}; the plot is `long_context.png`). "
        "Accuracy / mean latency:",
        "",
        *long_context_lines(src),
        "",
        long_context_summary(src),
    ]
    return "\n".join(wrap(lines)) + "\n"


# ------------------------------------------------------------------------------------------- docs/results.md
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


def with_readme_block(readme: str, block: str) -> str:
    """``readme`` with the text between its markers replaced by ``block``."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise ReportError(f"{README}: the markers {START} ... {END} are missing")
    return readme[: start + len(START)] + "\n" + block + readme[end:]


# --------------------------------------------------------------------------------------------------- command
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
