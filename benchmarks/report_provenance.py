"""A result file's provenance: its command, commit, machine and date as recorded, else git's, else "not recorded"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.report_source import Source, get

NOT_RECORDED = "not recorded"


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
