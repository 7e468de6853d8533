"""Decode step time through the runner: a Mixtral-style MoE decoder vs a dense decoder with the same *active*
parameters (dense intermediate = k * expert intermediate; same attention, embeddings and layer count).

Each row times ``ModelRunner.sample`` (greedy) on a decode step of B sequences with ``--context`` cached tokens
each (random weights; latency only), after one warm-up call whose time (compile) is recorded separately. MoE
variants: ``auto`` (the runner's choice from the static token bucket: gathered experts while tokens * k <=
experts, grouped ``ragged_dot`` otherwise) and each implementation forced. The MoE runners' token buckets start
at 1, the dense one's at 16, as ``ModelRunner`` sets them.

Usage: nice -n 10 python benchmarks/moe_decode.py [--batches 1,4,8,16] [--hidden 512] [--layers 4]
       [--experts 8] [--top-k 2] [--inter 1024] [--out benchmarks/results/moe_decode.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax

from benchmarks.common import RESULTS_DIR, OtherLoad, loadavg, run_header, write_results
from specrag_jax.models.config import ModelConfig, tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.sampling.batch import SamplingBatch


def configs(args: argparse.Namespace) -> dict[str, ModelConfig]:
    common = dict(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=8,
        num_kv_heads=4,
        head_dim=args.hidden // 8,
        max_position_embeddings=4096,
        sliding_window=None,
        layer_types=(),
    )
    moe = dict(common, intermediate_size=args.inter, num_experts=args.experts, experts_per_token=args.top_k)
    return {
        "dense_same_active": tiny_config("llama", **common, intermediate_size=args.top_k * args.inter),
        "moe_auto": tiny_config("mixtral", **moe),
        "moe_gather": tiny_config("mixtral", **moe, moe_impl="gather"),
        "moe_ragged": tiny_config("mixtral", **moe, moe_impl="ragged"),
    }


def time_decode(runner: ModelRunner, batch: int, context: int, min_repeats: int, max_s: float) -> dict[str, Any]:
    pages_per_seq = -(-(context + 1) // runner.page_size)
    chunks = [Chunk(runner.allocator.allocate(pages_per_seq), context, [5 + b], rows=[0]) for b in range(batch)]
    step = runner.pack(chunks)
    call = lambda: runner.sample(step, SamplingBatch.greedy(batch))  # noqa: E731
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    times: list[float] = []
    t_end = time.perf_counter() + max_s
    with OtherLoad() as other:
        while len(times) < min_repeats or (time.perf_counter() < t_end and len(times) < 200):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    for c in chunks:
        runner.allocator.release(c.pages)
    return {
        "tokens_bucket": int(step.tokens.shape[0]),
        "moe_impl": runner.cfg.moe_impl_for(int(step.tokens.shape[0])) if runner.cfg.num_experts else None,
        "median_ms": round(statistics.median(times), 3),
        "best_ms": round(min(times), 3),
        "repeats": len(times),
        "first_call_s": round(first, 2),
        "other_cores_busy": other.cores,
    }


def active_params(cfg: ModelConfig) -> dict[str, int]:
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    attn = h * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    ffn_total = (cfg.num_experts or 1) * 3 * h * i + h * cfg.num_experts
    ffn_active = (cfg.experts_per_token or 1) * 3 * h * i + h * cfg.num_experts
    return {"total_layers": layers * (attn + ffn_total), "active_layers": layers * (attn + ffn_active)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--inter", type=int, default=1024, help="expert intermediate size")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--context", type=int, default=128, help="cached tokens per sequence")
    ap.add_argument("--min-repeats", type=int, default=5)
    ap.add_argument("--max-s", type=float, default=2.0)
    ap.add_argument("--out", default=str(RESULTS_DIR / "moe_decode.json"))
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[str, Any] = {
        **run_header(),
        "backend": jax.default_backend(),
        "loadavg_start": loadavg(),
        "note": "shared machine: wall-clock times under the recorded load",
        "rows": [],
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "batches")},
    }
    runners = {}
    for name, cfg in configs(args).items():
        runners[name] = ModelRunner(
            cfg, init_params(cfg, seed=0), num_pages=16 * max(batches) + 8, page_size=16, max_seq_len=args.context + 64
        )
        results["config"][f"params_{name}"] = active_params(cfg)
    for batch in batches:
        row: dict[str, Any] = {"batch": batch, "loadavg_before": loadavg()}
        for name, runner in runners.items():
            row[name] = time_decode(runner, batch, args.context, args.min_repeats, args.max_s)
            print(
                f"batch={batch:3d} {name:18s} bucket {row[name]['tokens_bucket']:3d} "
                f"{str(row[name]['moe_impl']):7s} median {row[name]['median_ms']:8.3f} ms",
                flush=True,
            )
        row["moe_auto_over_dense"] = round(row["moe_auto"]["median_ms"] / row["dense_same_active"]["median_ms"], 2)
        results["rows"].append(row)
    results["loadavg_end"] = loadavg()
    print("wrote", write_results(args.out, results))


if __name__ == "__main__":
    main()
