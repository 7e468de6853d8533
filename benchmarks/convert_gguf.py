"""Cold GGUF -> float32 cache conversion, old loader vs new, with a per-phase breakdown and a bit-equality check.

Each (model, implementation) runs in a fresh subprocess with an empty ``SPECRAG_CACHE_DIR`` (the GGUF files are
resolved, i.e. assembled from their PyPI parts, beforehand; ``--assemble`` also times that step for Qwen):

- ``old``: the loader at ``--base`` (exported with ``git archive``): ``gguf.GGUFReader`` header, gguf-py
  ``dequantize``, ``assemble_params`` (transposes, stacking), ``to_jax_leaf`` (``device_put``) and the write of each
  leaf's bytes. To stay within this machine's memory rules each leaf is written and dropped as soon as it is
  built; the real old ``load_model_params`` also held the whole tree (Qwen: 9 GB peak RSS) before ``save_tree``.
- ``new``: ``load_model_params`` on the empty cache (header, plan, dequantisation into a memory map of the new
  cache entry on two threads, then the entry read back as a hit), timed inside; then, outside the code's own
  path, the compute alone (the same jobs into pre-touched memory, no file), an ``fsync`` of the entry (the code
  does not fsync) and a warm ``load_model_params``.

Both sides hash every leaf's bytes in tree order (sha256), so ``identical`` says the new cache holds exactly the
old conversion's numbers. Other engineers share this 2-core CPU: each row records the load average and the
process's user/sys CPU seconds, which vary less than wall time.

Usage: nice -n 10 python benchmarks/convert_gguf.py [--models qwen2.5-coder-1.5b-instruct,...] [--impls old,new]
       [--base 9e3ade5] [--assemble] [--out benchmarks/results/convert_gguf.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import REPO_ROOT, RESULTS_DIR, loadavg, run_header, write_results

MODELS = ("qwen2.5-coder-1.5b-instruct", "gemma3-270m", "smollm2-135m-instruct")
DEFAULT_BASE = "9e3ade5"  # the last commit with the gguf-py loader

# Runs against the old tree (PYTHONPATH): argv = gguf path, json out. Leaves are written as they are built.
OLD_CHILD = r"""
import hashlib, json, os, resource, sys, tempfile, time
import numpy as np
import specrag_jax.models.loading.gguf_loader as gl
from specrag_jax.models.loading.load import to_jax_leaf
path, out = sys.argv[1], sys.argv[2]
phase = {"header": 0.0, "dequantize": 0.0, "device_put": 0.0, "write": 0.0}
hashing = [0.0]
def timed(fn, name):
    def wrapped(*args):
        t = time.perf_counter(); r = fn(*args); phase[name] += time.perf_counter() - t; return r
    return wrapped
gl.dequantize, gl.open_gguf = timed(gl.dequantize, "dequantize"), timed(gl.open_gguf, "header")
put, digest = timed(to_jax_leaf("float32"), "device_put"), hashlib.sha256()
fh = tempfile.TemporaryFile(dir=os.environ["SPECRAG_CACHE_DIR"])
def leaf(x):
    data = np.asarray(put(x)).view(np.uint8).reshape(-1)
    timed(fh.write, "write")(data.data)
    t = time.perf_counter(); digest.update(data.data); hashing[0] += time.perf_counter() - t
c0, t0 = os.times(), time.perf_counter()
gl.load_gguf(path, leaf)
total, c1 = time.perf_counter() - t0 - hashing[0], os.times()
fh.close()
phase["assemble_transpose_rest"] = total - sum(phase.values())
json.dump({"total_s": total, "user_s": c1.user - c0.user, "sys_s": c1.system - c0.system, "phases_s": phase,
           "hashing_excluded_s": hashing[0], "sha256": digest.hexdigest(),
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, open(out, "w"))
"""


def new_child(path: str, out: str) -> None:
    """The new path, run in this process (a fresh subprocess of the benchmark)."""
    import hashlib
    import resource
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from specrag_jax.models.loading import load as loading
    from specrag_jax.models.loading.gguf_loader import gguf_config, open_gguf
    from specrag_jax.models.loading.gguf_plan import WORKERS, plan_leaves, run_jobs
    from specrag_jax.models.loading.param_file import read_header

    def clock() -> tuple[float, float, float]:
        t = os.times()
        return time.perf_counter(), t.user, t.system

    inner: dict[str, float] = {}
    convert = loading.convert_gguf_file

    def timed_convert(*args: Any) -> Any:
        t = time.perf_counter()
        cfg = convert(*args)
        inner["convert_s"] = time.perf_counter() - t
        return cfg

    loading.convert_gguf_file = timed_convert
    start = clock()
    loading.load_model_params(path)
    end = clock()
    info = loading.last_load_info()
    entry = Path(info.cache_entry) / "params" / "model.safetensors"
    t = time.perf_counter()
    reader = open_gguf(path)
    cfg = gguf_config(reader, path)
    plan = plan_leaves(cfg, reader)
    header_s = time.perf_counter() - t
    fd = os.open(entry, os.O_RDONLY)
    t = time.perf_counter()
    os.fsync(fd)
    fsync_s = time.perf_counter() - t
    os.close(fd)
    t = time.perf_counter()
    loading.load_model_params(path)
    warm_s = time.perf_counter() - t
    digest = hashlib.sha256()
    for tensor in read_header(entry).values():
        with open(entry, "rb") as fh:
            fh.seek(tensor.offset)
            left = tensor.nbytes
            while left:
                block = fh.read(min(left, 64 << 20))
                digest.update(block)
                left -= len(block)
    # Compute alone: the same jobs into memory touched beforehand (a layer slot reused across layers, one buffer
    # shared by the top-level leaves).
    top = np.ones(
        max(int(np.prod(shape)) for leaf, (shape, _) in plan.items() if not leaf.startswith("layers/")), np.float32
    )
    dests = {
        leaf: np.ones((1, *shape[1:]), np.float32)
        if leaf.startswith("layers/")
        else top[: int(np.prod(shape))].reshape(shape)
        for leaf, (shape, _) in plan.items()
    }
    work = [
        (dataclasses.replace(job, slot=(0, *job.slot[1:]) if job.slot else ()), dests[leaf])
        for leaf, (_, jobs) in plan.items()
        for job in jobs
    ]
    c0 = clock()
    with ThreadPoolExecutor(WORKERS) as pool:
        run_jobs(reader, work, pool)
    c1 = clock()
    json.dump(
        {
            "total_s": end[0] - start[0],
            "user_s": end[1] - start[1],
            "sys_s": end[2] - start[2],
            "phases_s": {
                "header_and_plan": header_s,
                "convert_into_cache_file": inner["convert_s"],
                "read_back_and_rest": end[0] - start[0] - inner["convert_s"],
                "compute_only_no_file": c1[0] - c0[0],
                "compute_only_cpu": (c1[1] - c0[1]) + (c1[2] - c0[2]),
                "fsync_not_done_by_code": fsync_s,
                "warm_load": warm_s,
            },
            "sha256": digest.hexdigest(),
            "workers": WORKERS,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
        open(out, "w"),
    )


def export_base(base: str, into: Path) -> None:
    """The package as it was at ``base`` (``git archive``), for the old loader."""
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", base, "specrag_jax"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def run_child(impl: str, gguf: Path, base_tree: Path | None) -> dict[str, Any]:
    """One measurement in a fresh subprocess with an empty cache directory (removed afterwards)."""
    with (
        tempfile.TemporaryDirectory(prefix="cold.", dir="/tmp") as cache,
        tempfile.NamedTemporaryFile(suffix=".json") as out,
    ):
        env = dict(os.environ, SPECRAG_CACHE_DIR=cache, PYTHONPATH=str(base_tree if impl == "old" else REPO_ROOT))
        cmd = (
            [sys.executable, "-c", OLD_CHILD, str(gguf), out.name]
            if impl == "old"
            else [sys.executable, str(Path(__file__).resolve()), "--child", str(gguf), out.name]
        )
        before = loadavg()
        t = time.perf_counter()
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, cwd=base_tree if impl == "old" else REPO_ROOT
        )  # python -c puts the cwd first
        if proc.returncode:
            raise SystemExit(f"{impl} child failed: {proc.stderr.strip().splitlines()[-1:]}")
        result = json.loads(Path(out.name).read_text())
        result.update(process_wall_s=time.perf_counter() - t, loadavg_before=before, loadavg_after=loadavg())
        return result


def time_assembly() -> dict[str, Any]:
    """Seconds to assemble Qwen's GGUF from its 22 part packages into an empty folder (a fresh clone's step)."""
    from specrag_jax.models.loading.registry import QWEN_CODER_1_5B
    from specrag_jax.models.loading.split_packages import assemble

    with tempfile.TemporaryDirectory(prefix="assemble.", dir="/tmp") as folder:
        t = time.perf_counter()
        assemble(QWEN_CODER_1_5B, Path(folder), progress=False)
        return {"assemble_s": time.perf_counter() - t, "loadavg": loadavg()}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        new_child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--impls", default="old,new")
    parser.add_argument("--base", default=DEFAULT_BASE)
    parser.add_argument("--assemble", action="store_true")
    parser.add_argument("--out", default=str(RESULTS_DIR / "convert_gguf.json"))
    args = parser.parse_args()
    from specrag_jax.models.loading.registry import resolve_model_path

    results: dict[str, Any] = {**run_header(), "base": args.base, "models": {}}
    if args.assemble:
        results["qwen_assembly"] = time_assembly()
    with tempfile.TemporaryDirectory(prefix="base.") as base_tree:
        export_base(args.base, Path(base_tree))
        for model in args.models.split(","):
            gguf = resolve_model_path(model)
            row: dict[str, Any] = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size}
            for impl in args.impls.split(","):
                row[impl] = run_child(impl, gguf, Path(base_tree))
                print(model, impl, json.dumps({k: row[impl][k] for k in ("total_s", "user_s", "sys_s")}), flush=True)
            if "old" in row and "new" in row:
                row["identical"] = row["old"]["sha256"] == row["new"]["sha256"]
                row["speedup"] = row["old"]["total_s"] / row["new"]["total_s"]
            results["models"][model] = row
            write_results(args.out, results)
    print(json.dumps({m: {k: r.get(k) for k in ("identical", "speedup")} for m, r in results["models"].items()}))


if __name__ == "__main__":
    main()
