"""Shared benchmark helpers: machine facts, versions, memory, bandwidth, timing stats, results JSON."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import math
import os
import resource
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from specrag_jax.host_memory import status_mib
from specrag_jax.machine_peaks import best_time
from specrag_jax.run_facts import checkout_commit, machine_info

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

# Five different English prompts of similar length (~100 tokens each); a batch of b uses the first b.
PROMPTS = [
    "Retrieval-augmented generation combines a language model with a search step. Before answering, the "
    "system looks up passages that are likely to contain the facts it needs, places them in the prompt, and "
    "then writes an answer grounded in that evidence. This makes answers easier to check and keeps the model "
    "current without retraining. Speculative approaches go further: a small model drafts several answers from "
    "different subsets of the documents, and a larger model picks the best one. Explain in plain words why",
    "The history of the printing press begins long before Gutenberg. Woodblock printing was used in China "
    "more than a thousand years earlier, and movable type made of clay and later of metal appeared in China "
    "and Korea. In fifteenth-century Europe, the combination of an oil-based ink, a screw press adapted from "
    "wine making, and a reliable way to cast metal letters made printing fast and cheap. Within fifty years, "
    "presses were working in hundreds of towns. Describe the main effects this had on",
    "A good night of sleep depends on more than the number of hours spent in bed. Regular times for going to "
    "sleep and waking up help the body keep its internal clock steady. Light in the evening, especially from "
    "screens, can delay the release of melatonin, while bright light in the morning does the opposite. "
    "Caffeine late in the day, heavy meals and alcohol can all make sleep lighter and more broken. Exercise "
    "usually helps, as long as it is not too close to bedtime. List practical steps that",
    "Rivers shape the land they flow through in many ways. Near their sources they are often steep and fast, "
    "cutting narrow valleys into rock and carrying stones downstream. Further along, the slope eases and the "
    "river begins to wind from side to side, building wide flood plains out of fine sediment. When a river "
    "finally reaches the sea, it slows down and drops whatever it still carries, sometimes forming a delta "
    "with many channels. People have settled along rivers for water, food and transport. Explain how",
    "Learning to program is mostly learning to break problems into smaller parts. A beginner first meets "
    "variables, conditions and loops, and then discovers that the hard part is not the syntax but deciding "
    "what the program should do step by step. Reading other people's code, writing small tests and fixing "
    "bugs one at a time all build this skill. Over time, programmers learn to name things clearly, to keep "
    "functions short, and to notice when a piece of code is doing too much. Give advice to someone who",
]


def loadavg() -> list[float]:
    """The 1/5/15-minute load averages from /proc/loadavg (empty when unavailable)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def versions(packages: Sequence[str] = ("jax", "jaxlib", "flax", "numpy", "torch", "transformers", "gguf")) -> dict:
    """Installed versions of the packages that matter (None when missing)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss is KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def current_rss_mb() -> float | None:
    """Current resident set size of this process in MiB (VmRSS)."""
    return status_mib("VmRSS")


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) so later peaks exclude e.g. model loading."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_since_reset_mb() -> float | None:
    """RSS high-water mark (VmHWM) in MiB since the last ``reset_peak_rss`` (or process start)."""
    return status_mib("VmHWM")


class RssPhases:
    """Peak RSS per phase: ``phase()`` returns the high-water mark since the previous call, then resets it."""

    def __init__(self) -> None:
        self.overall = 0.0

    def phase(self) -> float:
        hwm = peak_rss_since_reset_mb() or peak_rss_mb()
        self.overall = max(self.overall, hwm)
        reset_peak_rss()  # note: this also resets ru_maxrss, hence the running maximum
        return hwm


def summarize(values: Sequence[float], best: float | None = None) -> dict[str, Any]:
    """Median, best (max of the rates unless given) and all values, rounded; non-finite values are None."""
    ok = [v for v in values if math.isfinite(v)]
    return {
        "median": round(statistics.median(ok), 3) if ok else None,
        "best": round(max(ok) if best is None else best, 3) if ok or best is not None else None,
        "all": [round(v, 3) if math.isfinite(v) else None for v in values],
    }


def measure_read_bandwidth(gib: float = 1.0, repeats: int = 5) -> dict[str, Any]:
    """Read bandwidth in GB/s (1e9 B/s): numpy sum and a jitted jnp.sum over a ``gib`` GiB float32 array."""
    import numpy as np

    n = int(gib * 1024**3) // 4
    a = np.ones(n, np.float32)
    a.sum()  # touch every page once
    t_np = best_time(functools.partial(np.add.reduce, a), repeats)
    out: dict[str, Any] = {
        "array_bytes": a.nbytes,
        "repeats": repeats,
        "stat": "best",
        "numpy_sum_gbps": round(a.nbytes / t_np / 1e9, 2),
    }
    try:
        import jax
        import jax.numpy as jnp

        x = jax.device_put(a)
        del a
        f = jax.jit(jnp.sum)
        f(x).block_until_ready()
        t_jax = best_time(lambda: f(x).block_until_ready(), repeats)
        out["jax_sum_gbps"] = round(x.nbytes / t_jax / 1e9, 2)
    except Exception as exc:
        out["jax_error"] = repr(exc)
    out["max_gbps"] = max(v for k, v in out.items() if k.endswith("_gbps"))
    return out


def cpu_busy_s() -> float:
    """Machine-wide busy CPU seconds so far (all cores, from /proc/stat; 0 when unavailable)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds used by this process's waited-for children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class OtherLoad:
    """Context manager: average cores used by *other* processes while the block ran (``.cores``)."""

    cores: float = 0.0

    def __enter__(self) -> "OtherLoad":
        r = resource.getrusage(resource.RUSAGE_SELF)
        self._t, self._b, self._c = time.perf_counter(), cpu_busy_s(), r.ru_utime + r.ru_stime
        return self

    def __exit__(self, *exc: object) -> None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        own = r.ru_utime + r.ru_stime - self._c
        self.cores = round(max(cpu_busy_s() - self._b - own, 0.0) / (time.perf_counter() - self._t), 2)


def wait_for_idle(max_busy_cores: float, max_wait_s: float, sample_s: float = 2.0) -> dict[str, Any]:
    """Wait (up to ``max_wait_s``) until other processes use fewer than ``max_busy_cores`` cores."""
    t0 = time.perf_counter()
    while True:
        b0 = cpu_busy_s()
        time.sleep(sample_s)
        busy = (cpu_busy_s() - b0) / sample_s
        waited = time.perf_counter() - t0
        if busy < max_busy_cores or waited >= max_wait_s:
            return {"busy_cores_before": round(busy, 2), "waited_s": round(waited, 1)}


def command_line() -> str:
    """The command that started this run, shell-quoted."""
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def git_state() -> dict[str, Any]:
    """Commit of the checkout and the files that differ from it (read-only git queries)."""
    import subprocess

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": checkout_commit(),
        "changed_files": [line[3:] for line in git("status", "--porcelain").splitlines()],
    }


def portable(value: Any) -> Any:
    """``value`` with this machine's absolute paths made portable, recursively: the checkout becomes
    repo-relative ("benchmarks/results/x.json", "." for the root), its sibling shared/ folder "../shared/...",
    the home folder "~" and the temporary folder "$TMPDIR"."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if not isinstance(value, str) or "/" not in value:
        return value
    import tempfile

    roots = [
        (str(REPO_ROOT) + "/", ""),
        (str(REPO_ROOT.parent) + "/", "../"),
        (str(Path.home()) + "/", "~/"),
        (str(Path(tempfile.gettempdir())) + "/", "$TMPDIR/"),
    ]
    if value == str(REPO_ROOT):
        return "."
    for root, short in roots:
        value = value.replace(" " + root, " " + short).replace("=" + root, "=" + short)
        if value.startswith(root):
            value = short + value[len(root) :]
    return value


def run_header() -> dict[str, Any]:
    """Command, timestamp, machine and versions: the fields every results file starts with."""
    return {
        "command": command_line(),
        "cwd": os.getcwd(),
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
        "git": git_state(),
    }


def write_results(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON with portable paths (creating the folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(payload), indent=2) + "\n")
    return path


ALTERNATION = ("off", "on", "on", "off")


def alternate_off_on(run, rounds: int) -> tuple[dict[str, dict], list[str], dict[str, list[dict]]]:
    """An A/B of one switch in new processes: ``run(on)`` once per side untimed (warm-up), then ``rounds`` timed
    runs per side in the order off, on, on, off, ... Returns (warm-up per side, the timed order, runs per side)."""
    order = [ALTERNATION[i % 4] for i in range(2 * rounds)]
    warm = {side: run(side == "on") for side in ("off", "on")}
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for side in order:
        runs[side].append(run(side == "on"))
    return warm, order, runs


def load_tuned_drafter(max_batch: int):
    """The default pair's drafter with its tuned adapter, as the pipeline loads it (2048-token sequences)."""
    from specrag_jax.adapters import DEFAULT_ADAPTERS
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.pipeline.factory import DEFAULT_DRAFTER
    from specrag_jax.training.lora_merge import adapter_transform

    adapter = adapter_transform(DEFAULT_DRAFTER, DEFAULT_ADAPTERS[DEFAULT_DRAFTER])
    return TextModel.load(DEFAULT_DRAFTER, max_seq_len=2048, max_batch=max_batch, transform_params=adapter)
