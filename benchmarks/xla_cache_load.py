"""Where a second ``specrag ask`` spends its XLA time: loading each step program from the persistent cache.

Runs ``specrag ask`` in this process (the cache must already hold its programs: run the same command once
before) with JAX's persistent-cache read wrapped, so every program's read, decompression and deserialisation
are timed apart, and counts the object files in each serialized executable (XLA:CPU stores one per fused
kernel; a new process links them all again). Uses JAX internals (``jax._src.compilation_cache``): a JAX update
that changes them makes this script fail loudly, never report wrong numbers.

    python benchmarks/xla_cache_load.py --out benchmarks/results/xla_cache_load.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results

QUESTION = "How do I leave a loop early in Python?"  # the Makefile's `make run` question


def timed_cache_reads(records: list[dict]):
    """Wrap JAX's persistent-cache read; append one record per program loaded."""
    from jax._src import compilation_cache as cc
    from jax._src import compiler

    def get_executable_and_time(cache_key, compile_options, backend, executable_devices):
        cache = cc._get_cache(backend)
        if cache is None:
            return None, None
        t0 = time.perf_counter()
        blob = cache.get(cache_key)
        if blob is None:
            return None, None
        t1 = time.perf_counter()
        serialized, compile_time = cc.extract_executable_and_time(cc.decompress_executable(blob))
        t2 = time.perf_counter()
        executable = backend.deserialize_executable(serialized, executable_devices, compile_options)
        t3 = time.perf_counter()
        records.append(
            {
                "program": cache_key.split("-")[0],
                "stored_mb": len(blob) / 1e6,
                "serialized_mb": len(serialized) / 1e6,
                "object_files": serialized.count(b"\x7fELF"),
                "read_s": t1 - t0,
                "decompress_s": t2 - t1,
                "deserialize_s": t3 - t2,
                "compile_s_whole": compile_time,  # JAX stores whole seconds
            }
        )
        return executable, compile_time

    if compiler.compilation_cache is not cc or not hasattr(cc, "get_executable_and_time"):
        raise SystemExit("jax._src.compilation_cache changed: update benchmarks/xla_cache_load.py")
    cc.get_executable_and_time = get_executable_and_time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--question", default=QUESTION)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from specrag_jax.cli import main as cli_main
    from specrag_jax.compile_time import compile_stats

    records: list[dict] = []
    timed_cache_reads(records)
    before = compile_stats()
    t = time.perf_counter()
    if cli_main(["ask", args.question, "-q"]) != 0:
        raise SystemExit("specrag ask failed")
    wall = time.perf_counter() - t
    xla = compile_stats() - before
    big = sorted(records, key=lambda r: -r["deserialize_s"])
    steps = [r for r in records if r["object_files"] > 20]  # the model step programs (unrolled layers)
    result = {
        **run_header(),
        "question": args.question,
        "ask_wall_s": wall,
        "xla": {
            "total_s": xla.total_s,
            "trace_s": xla.trace_s,
            "lower_s": xla.lower_s,
            "compile_s": xla.xla_compile_s,
            "cache_load_s": xla.cache_load_s,
        },
        "programs": len(records),
        "deserialize_s": sum(r["deserialize_s"] for r in records),
        "step_programs": len(steps),
        "step_programs_deserialize_s": sum(r["deserialize_s"] for r in steps),
        "step_programs_object_files": sum(r["object_files"] for r in steps),
        "read_and_decompress_s": sum(r["read_s"] + r["decompress_s"] for r in records),
        "per_program": big,
    }
    print(
        f"ask {wall:.1f} s; XLA {xla.total_s:.1f} s (cache load {xla.cache_load_s:.1f}); {len(records)} programs "
        f"loaded, deserialisation {result['deserialize_s']:.1f} s, of which {len(steps)} model steps "
        f"{result['step_programs_deserialize_s']:.1f} s ({result['step_programs_object_files']} object files); "
        f"read + decompress {result['read_and_decompress_s']:.2f} s"
    )
    for r in big[:6]:
        print(
            f"  {r['program']}: {r['serialized_mb']:.1f} MB, {r['object_files']} object files, "
            f"deserialise {r['deserialize_s']:.2f} s (compiled in about {r['compile_s_whole']} s)"
        )
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
