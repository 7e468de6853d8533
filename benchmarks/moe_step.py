"""Sparse MoE block step time: grouped (ragged_dot) vs gathered experts vs the dense all-experts reference vs a
dense SwiGLU MLP with the same *active* parameters (intermediate = k * expert intermediate).

Every MoE variant includes the router (logits, top-k, softmax). One jitted call runs ``--layers`` such blocks
(distinct weights, residual ``x + block(x)``, as a decoder step would) so the weights do not stay in the
last-level cache between calls (here 32 MiB L3 vs 50 MB of experts per layer at the defaults). Times are per
call after one warm-up (compile time recorded separately) and per layer, on the default backend (CPU here).
On CPU jax lowers ``lax.ragged_dot`` to a masked dense dot over every group, so "ragged" does
tokens*k*experts row-matmuls there; on GPU/TPU it is XLA's grouped ragged-dot. "gather" copies each row's
expert weights, so it is run only up to ``--gather-max-rows`` rows (tokens * k).

Usage: nice -n 10 python benchmarks/moe_step.py [--tokens 1,16,256] [--hidden 512] [--experts 8] [--top-k 2]
       [--inter 1024] [--layers 4] [--dtype float32] [--out benchmarks/results/moe_step.json]
The machine may be shared: loadavg and other processes' CPU use are recorded beside each row.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import RESULTS_DIR, OtherLoad, loadavg, run_header, write_results
from specrag_jax.models.decoder.moe import dense_moe_reference, moe_block, route


def moe_params(key: jax.Array, hidden: int, experts: int, inter: int) -> dict:
    k1, k2, k3, k4 = jax.random.split(key, 4)
    n = lambda k, s, fan: jax.random.normal(k, s, jnp.float32) / np.sqrt(fan)  # noqa: E731
    return {
        "router": {"kernel": n(k1, (hidden, experts), hidden)},
        "gate": {"kernel": n(k2, (experts, hidden, inter), hidden)},
        "up": {"kernel": n(k3, (experts, hidden, inter), hidden)},
        "down": {"kernel": n(k4, (experts, inter, hidden), inter)},
    }


def dense_mlp(x: jax.Array, params: dict, dtype: jnp.dtype) -> jax.Array:
    """down(silu(gate x) * up x): the dense MLP with the MoE's active parameters."""
    xd = x.astype(dtype)
    g, u, d = (params[n]["kernel"].astype(dtype) for n in ("gate", "up", "down"))
    return (jax.nn.silu(xd @ g) * (xd @ u)) @ d


def reference_block(x: jax.Array, params: dict, top_k: int, dtype: jnp.dtype) -> jax.Array:
    weights, experts, _ = route(x, params["router"]["kernel"], top_k, dtype)
    return dense_moe_reference(x, weights, experts, params, dtype)


def stacked(block: Callable, x: jax.Array, layers: list[dict]) -> jax.Array:
    """``x + block(x)`` over every layer's parameters (a Python loop, as the decoder runs its layers)."""
    for params in layers:
        x = x + block(x, params).astype(x.dtype)
    return x


def time_calls(fn: Callable[[], Any], min_repeats: int, max_s: float) -> dict[str, Any]:
    """Wall times (ms) of ``fn`` repeated at least ``min_repeats`` times and until ``max_s`` have passed."""
    times: list[float] = []
    t_end = time.perf_counter() + max_s
    while len(times) < min_repeats or (time.perf_counter() < t_end and len(times) < 200):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": round(statistics.median(times), 3), "best_ms": round(min(times), 3), "repeats": len(times)}


def bench_tokens(tokens: int, args: argparse.Namespace, moe: list[dict], mlp: list[dict]) -> dict[str, Any]:
    dtype = jnp.dtype(args.dtype)
    x = jax.random.normal(jax.random.key(tokens), (tokens, args.hidden), jnp.float32)
    variants: dict[str, tuple[Callable, list[dict]]] = {
        "moe_ragged": (functools.partial(moe_block, top_k=args.top_k, dtype=dtype, impl="ragged"), moe),
        "moe_gather": (functools.partial(moe_block, top_k=args.top_k, dtype=dtype, impl="gather"), moe),
        "moe_dense_reference": (functools.partial(reference_block, top_k=args.top_k, dtype=dtype), moe),
        "dense_active_mlp": (functools.partial(dense_mlp, dtype=dtype), mlp),
    }
    row: dict[str, Any] = {"tokens": tokens, "rows": tokens * args.top_k, "loadavg_before": loadavg()}
    ref = None
    for name, (fn, params) in variants.items():
        if name == "moe_gather" and tokens * args.top_k > args.gather_max_rows:
            row[name] = {"skipped": f"{tokens * args.top_k} rows > --gather-max-rows {args.gather_max_rows}"}
            continue
        step = jax.jit(functools.partial(stacked, fn))
        t0 = time.perf_counter()
        out = jax.block_until_ready(step(x, params))
        compile_s = time.perf_counter() - t0
        with OtherLoad() as other:
            stats = time_calls(lambda: step(x, params), args.min_repeats, args.max_s)
        entry = {
            **stats,
            "median_ms_per_layer": round(stats["median_ms"] / args.layers, 3),
            "first_call_s": round(compile_s, 3),
            "other_cores_busy": other.cores,
        }
        if name.startswith("moe"):
            ref = out if ref is None else ref
            entry["max_abs_diff_vs_ragged"] = float(jnp.max(jnp.abs(out - ref)))
        row[name] = entry
        print(
            f"tokens={tokens:4d} {name:20s} median {stats['median_ms']:9.3f} ms  best {stats['best_ms']:9.3f} ms"
            f"  ({args.layers} layers; others busy {other.cores} cores)",
            flush=True,
        )
    row["loadavg_after"] = loadavg()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,16,256")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--inter", type=int, default=1024, help="expert intermediate size")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layers", type=int, default=4, help="blocks per call (distinct weights)")
    ap.add_argument("--gather-max-rows", type=int, default=32)
    ap.add_argument("--min-repeats", type=int, default=5)
    ap.add_argument("--max-s", type=float, default=3.0, help="keep repeating each variant up to this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS_DIR / "moe_step.json"))
    args = ap.parse_args()
    keys = jax.random.split(jax.random.key(args.seed), 2 * args.layers)
    moe = [moe_params(keys[i], args.hidden, args.experts, args.inter) for i in range(args.layers)]
    active = args.top_k * args.inter
    mlp = [
        jax.tree.map(
            lambda a: a[0],
            {k: v for k, v in moe_params(keys[args.layers + i], args.hidden, 1, active).items() if k != "router"},
        )
        for i in range(args.layers)
    ]
    expert_params = 3 * args.hidden * args.inter
    results: dict[str, Any] = {
        **run_header(),
        "backend": jax.default_backend(),
        "loadavg_start": loadavg(),
        "note": "shared machine: times are wall-clock under the recorded load (loadavg, other_cores_busy)",
        "config": {
            "hidden": args.hidden,
            "experts": args.experts,
            "top_k": args.top_k,
            "expert_intermediate": args.inter,
            "dense_intermediate": active,
            "dtype": args.dtype,
            "layers": args.layers,
            "params_total_moe": args.experts * expert_params + args.hidden * args.experts,
            "params_active_moe": args.top_k * expert_params + args.hidden * args.experts,
            "params_dense_mlp": 3 * args.hidden * active,
        },
        "rows": [],
    }
    for tokens in (int(t) for t in args.tokens.split(",")):
        results["rows"].append(bench_tokens(tokens, args, moe, mlp))
    results["loadavg_end"] = loadavg()
    print("wrote", write_results(args.out, results))


if __name__ == "__main__":
    main()
