"""Table 1's shape from a suite's results: rows are methods, columns are tasks; each cell holds the accuracy, the
mean latency and the latency reduction against standard RAG, beside the paper's reference accuracies, with the model
pair and the hardware recorded. ``build_table`` makes ``table.json``; ``table_markdown`` makes ``table.md``."""

from __future__ import annotations

import os
import platform
from typing import Any, Sequence

from specrag_jax.evaluation.suite import SuiteFile

# Speculative RAG (Wang et al. 2024), Table 1, accuracy (%): standard RAG with Mixtral-8x7B; Speculative RAG with the
# Mistral-7B drafter (M_Drafter-7B) and the Mixtral-8x7B verifier; the drafter alone. None: not reported.
PAPER_TASKS = ("triviaqa", "musique", "popqa", "pubhealth", "arc_c")
PAPER_NAMES = {
    "triviaqa": "TriviaQA",
    "musique": "MuSiQue",
    "popqa": "PopQA",
    "pubhealth": "PubHealth",
    "arc_c": "ARC-Challenge",
}
PAPER = {
    "standard": dict(zip(PAPER_TASKS, (73.91, None, 53.68, None, None))),
    "speculative": dict(zip(PAPER_TASKS, (74.24, 31.57, 57.54, 76.60, 80.55))),
    "drafter_only": dict(zip(PAPER_TASKS, (71.11, 27.89, 56.40, 75.58, 74.49))),
}
PAPER_MODELS = {
    "standard": "Mixtral-8x7B",
    "speculative": "M_Drafter-7B (Mistral-7B) + Mixtral-8x7B verifier",
    "drafter_only": "M_Drafter-7B (Mistral-7B) alone",
}


def hardware() -> dict[str, Any]:
    """The accelerator (JAX backend, device kind and count) and the host (CPU count, architecture)."""
    import jax

    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }


def _cell(results: dict[str, Any], method: str) -> dict[str, Any] | None:
    m = results["methods"].get(method)
    if m is None:
        return None
    latency = m["latency_s"]["mean"]
    standard = results["methods"].get("standard")
    base = standard["latency_s"]["mean"] if standard else None
    return {
        "accuracy": round(100 * m["accuracy"], 2),
        "latency_s": round(latency, 4),
        "latency_reduction": None if not base else round(1 - latency / base, 4),
        "n": m["n"],
    }


def build_table(
    per_file: dict[str, dict[str, Any]],
    files: Sequence[SuiteFile],
    methods: Sequence[str],
    models: dict[str, Any],
    machine: dict[str, Any],
) -> dict[str, Any]:
    """``{"columns", "files", "rows": {method: {column: cell}}, "paper", "models", "hardware"}``; a cell is
    ``{"accuracy" (%), "latency_s" (mean, compilation excluded), "latency_reduction" (1 - latency / standard's),
    "n"}``."""
    columns = [f.column for f in files]
    described = {
        f.column: {
            "path": str(f.path),
            "format": f.data.format,
            "task": f.data.task,
            "n": len(f.rows),
            **{k: per_file[f.column]["config"].get(k) for k in ("n_docs", "m", "k")},
        }
        for f in files
    }
    rows = {method: {c: _cell(per_file[c], method) for c in columns} for method in methods}
    paper = {method: {"models": PAPER_MODELS[method], "accuracy": PAPER[method]} for method in PAPER}
    return {"columns": columns, "files": described, "rows": rows, "paper": paper, "models": models, "hardware": machine}


def _fmt_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    text = f"{cell['accuracy']:.1f} · {cell['latency_s']:.2f} s"
    reduction = cell["latency_reduction"]
    return text if reduction is None else f"{text} ({100 * reduction:+.0f}%)"


def _fmt_paper(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table_markdown(table: dict[str, Any]) -> str:
    """The table as Markdown: this run (accuracy %, mean latency, reduction vs standard RAG), then the paper's."""
    cols, files = table["columns"], table["files"]
    head = [f"{c} (n={files[c]['n']}, {files[c]['format']})" for c in cols]
    lines = [
        "## This run",
        "",
        f"Models: drafter {table['models'].get('drafter')} (adapter {table['models'].get('drafter_adapter')}), "
        f"verifier {table['models'].get('verifier')}. Hardware: {_hardware_text(table['hardware'])}.",
        "",
        "Each cell: accuracy (%) · mean latency per question (compilation excluded) (latency reduction vs "
        "standard RAG).",
        "",
        "| method | " + " | ".join(head) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    lines += [
        f"| {method} | " + " | ".join(_fmt_cell(row[c]) for c in cols) + " |" for method, row in table["rows"].items()
    ]
    lines += [
        "",
        "## Paper (Speculative RAG, Table 1: accuracy %)",
        "",
        "| method | models | " + " | ".join(PAPER_NAMES[t] for t in PAPER_TASKS) + " |",
        "|---" * (len(PAPER_TASKS) + 2) + "|",
    ]
    lines += [
        f"| {method} | {p['models']} | " + " | ".join(_fmt_paper(p["accuracy"][t]) for t in PAPER_TASKS) + " |"
        for method, p in table["paper"].items()
    ]
    return "\n".join(lines) + "\n"


def _hardware_text(machine: dict[str, Any]) -> str:
    return (
        f"{machine.get('device_count')} x {machine.get('device_kind')} ({machine.get('backend')}), "
        f"{machine.get('cpu_count')} CPUs ({machine.get('machine')})"
    )
