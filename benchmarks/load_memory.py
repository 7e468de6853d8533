"""Peak host memory of loading a synthetic >= 1 GB Hugging Face checkpoint: host-assembled vs streamed loads.

Writes a Llama-architecture checkpoint (few layers, big tensors, float32, several safetensors shards with a
``model.safetensors.index.json``) to a temporary folder, then loads it once per mode, each in a fresh
subprocess that reports its RSS before loading (after jax is up), its peak RSS while loading (the kernel's
high-water mark, reset just before, with ``ru_maxrss`` as a fallback), and the seconds taken:

- ``hf_old``: ``hf_loader.load_hf`` + ``load.to_jax_leaf`` (the loader before streaming: every stacked leaf
  assembled on the host, every shard's pages kept mapped to the end);
- ``hf_new``: ``load_model_params(..., cache=False)`` (``hf_streaming``: bounded blocks, in place);
- ``hf_new_sharded``: the same into ``Placement.from_spec("model=4")`` shardings over 4 host devices;
- ``cache_write``: a first ``load_model_params`` with the cache on (streamed load + writing the entry);
- ``cache_old``: reading that entry as ``param_file.load_tree`` did before (one map of the whole file, each
  tensor ``device_put`` from it);
- ``cache_new``: ``load_model_params`` from that entry (whole leaves put from per-tensor maps: on CPU jax
  aliases the mapping, so nothing is copied or resident until used, as with ``cache_old``);
- ``cache_new_sharded``: that entry into the ``model=4`` shardings (split leaves in blocks, per device).

The bound the tests hold the streamed loads to: peak - before < checkpoint bytes + 2 x the largest tensor.
On CPU the device arrays are host memory, so the loaded model itself accounts for the checkpoint bytes.

Usage: nice -n 10 python benchmarks/load_memory.py [--layers 3] [--hidden 2048] [--inter 16384] [--vocab 8192]
       [--shard-mb 512] [--modes hf_old,hf_new,...] [--out benchmarks/results/load_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax
import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    current_rss_mb,
    loadavg,
    peak_rss_since_reset_mb,
    reset_peak_rss,
    run_header,
    write_results,
)
from benchmarks.synthetic_hf import llama_config, write_checkpoint
from specrag_jax.models.loading.hf_loader import load_hf
from specrag_jax.models.loading.load import last_load_info, load_model_params, to_jax_leaf
from specrag_jax.models.loading.param_file import read_header
from specrag_jax.models.loading.params import unflatten
from specrag_jax.models.loading.streaming import CHUNK_BYTES
from specrag_jax.parallel import Placement

MODES = ("hf_old", "hf_new", "hf_new_sharded", "cache_write", "cache_old", "cache_new", "cache_new_sharded")
MB = 1024 * 1024


def big_config(layers: int, hidden: int, inter: int, vocab: int) -> dict[str, Any]:
    """Llama config.json: ``layers`` layers, 128-wide heads (a quarter of them K/V), untied head."""
    heads = hidden // 128
    return llama_config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=128,
    )


def legacy_cache_load(path: Path) -> dict[str, Any]:
    """``param_file.load_tree`` before streaming: one memory map of the whole file, each tensor put from it."""
    header = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {
        name: jax.device_put(data[i.offset : i.offset + i.nbytes].view(i.dtype).reshape(i.shape))
        for name, i in header.items()
    }
    return unflatten(jax.block_until_ready(out))


def _load(mode: str, path: Path) -> Any:
    if mode == "hf_old":
        return load_hf(path, to_jax_leaf("float32"))[1]
    if mode == "hf_new":
        return load_model_params(str(path), cache=False)[1]
    if mode == "hf_new_sharded":
        placement = Placement.from_spec("model=4", jax.devices()[:4])
        return load_model_params(str(path), cache=False, shardings=placement.param_shardings)[1]
    shardings = None
    if mode == "cache_new_sharded":
        shardings = Placement.from_spec("model=4", jax.devices()[:4]).param_shardings
    params = load_model_params(str(path), cache=True, shardings=shardings)[1]
    hit = last_load_info().from_cache
    if hit != (mode != "cache_write"):
        raise RuntimeError(f"{mode}: expected from_cache={mode != 'cache_write'}, got {hit}")
    return params


def child(mode: str, path: Path, entry: str | None) -> dict[str, Any]:
    """Run one load in this (fresh) process and measure it."""
    jax.devices()
    jax.block_until_ready(jax.numpy.zeros(4) + 1)  # backend up before the baseline
    reset_peak_rss()
    before = current_rss_mb()
    t0 = time.perf_counter()
    params = legacy_cache_load(Path(entry)) if mode == "cache_old" else _load(mode, path)
    jax.block_until_ready(params)
    seconds = time.perf_counter() - t0
    peak = peak_rss_since_reset_mb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    after = current_rss_mb()
    leaves = jax.tree.leaves(params)
    head = np.asarray(params["embed"]["embedding"].addressable_shards[0].data[:2]).astype(np.float32)
    return {
        "mode": mode,
        "rss_before_mb": before,
        "peak_rss_mb": round(peak, 1),
        "peak_minus_before_mb": round(peak - before, 1),
        "rss_after_mb": after,
        "seconds": round(seconds, 3),
        "param_bytes": int(sum(a.nbytes for a in leaves)),
        "devices": len({d for a in leaves for d in a.devices()}),
        "embed_head_sum": float(head.sum()),
    }


def measure(mode: str, path: Path, cache_dir: Path, entry: Path | None = None, timeout: float = 1800) -> dict:
    """``child(mode, path)`` in a fresh interpreter (4 host CPU devices for the sharded mode)."""
    env = {**os.environ, "SPECRAG_CACHE_DIR": str(cache_dir), "JAX_PLATFORMS": "cpu"}
    if mode.endswith("_sharded"):
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--path", str(path)]
    if entry is not None:
        cmd += ["--entry", str(entry)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{mode} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cache_file(cache_dir: Path) -> Path:
    """The params file of the (single) cache entry under ``cache_dir``."""
    (entry,) = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return entry / "params" / "model.safetensors"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--child", choices=MODES)
    ap.add_argument("--path", type=Path)
    ap.add_argument("--entry")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--shard-mb", type=int, default=512)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "load_memory.json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.path, args.entry)))
        return
    header = run_header()
    with tempfile.TemporaryDirectory(prefix="load_memory-") as tmp:
        ckpt, cache_dir = Path(tmp) / "ckpt", Path(tmp) / "cache"
        raw = big_config(args.layers, args.hidden, args.inter, args.vocab)
        t0 = time.perf_counter()
        sizes = write_checkpoint(ckpt, raw, shard_bytes=args.shard_mb * MB)
        write_s = time.perf_counter() - t0
        bound_mb = (sizes["bytes"] + 2 * sizes["largest_tensor_bytes"]) / MB
        rows = []
        for mode in args.modes.split(","):
            entry = cache_file(cache_dir) if mode == "cache_old" else None
            row = measure(mode, ckpt, cache_dir, entry)
            row["within_bound"] = row["peak_minus_before_mb"] < bound_mb
            print(json.dumps(row), flush=True)
            rows.append(row)
    payload = {
        **header,
        "loadavg_start": loadavg(),
        "config": raw,
        "write_seconds": round(write_s, 1),
        "checkpoint_bytes": sizes["bytes"],
        "checkpoint_mb": round(sizes["bytes"] / MB, 1),
        "largest_tensor_mb": round(sizes["largest_tensor_bytes"] / MB, 1),
        "shards": sizes["shards"],
        "tensors": sizes["tensors"],
        "bound_mb": round(bound_mb, 1),
        "bound": "peak_minus_before_mb < checkpoint bytes + 2 x largest tensor",
        "note": "float32 checkpoint loaded as float32 on CPU, where device arrays are host memory: the "
        "loaded model alone is about the checkpoint size. Each mode runs in a fresh subprocess "
        "(warm page cache); peak is VmHWM after a reset just before the load.",
        "chunk_bytes": CHUNK_BYTES,
        "rows": rows,
        "summary_peak_minus_before_mb": {r["mode"]: r["peak_minus_before_mb"] for r in rows},
        "summary_seconds": {r["mode"]: r["seconds"] for r in rows},
        "loadavg_end": loadavg(),
    }
    print(write_results(args.out, payload))


if __name__ == "__main__":
    main()
