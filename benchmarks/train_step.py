"""Train-step throughput (tokens/s) of `specrag train`'s jitted step, LoRA or full, tiny or real model.

    python benchmarks/train_step.py --model tiny --steps 50
    python benchmarks/train_step.py --model smollm2-135m-instruct --steps 20 --batch 4 --length 512

Examples are random token ids shaped like drafter data (prompt ~75% of the row, target ~15%), packed into
``--batch`` rows of ``--length`` tokens; every step has the same shape, so after the first (compiling) step the
time is the step itself. Real tokens (not padding) count. Results: benchmarks/results/train_step_<model>_<mode>.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS_DIR, run_header, summarize, write_results
from specrag_jax.models.decoder.transformer import unstack_layers
from specrag_jax.training import sharding as sh
from specrag_jax.training.batching import BatchPlan
from specrag_jax.training.data import Example
from specrag_jax.training.lora import LoraConfig, count_params, init_lora
from specrag_jax.training.step import BATCH_FIELDS, OptimConfig, make_optimizer, make_steps


def load(name: str, dtype: str):
    if name == "tiny":
        from specrag_jax.models.config import tiny_config
        from specrag_jax.models.decoder.transformer import init_params

        cfg = tiny_config("llama")
        return cfg, init_params(cfg, seed=0)
    from specrag_jax.models.loading.load import load_model_params

    return load_model_params(name, dtype=dtype)


def examples(n: int, length: int, vocab: int, seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = int(length * rng.uniform(0.6, 0.85))
        t = int(length * rng.uniform(0.08, 0.14))
        out.append(Example(rng.integers(3, vocab, p).astype(np.int32), rng.integers(3, vocab, t).astype(np.int32)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--mode", default="lora", choices=["lora", "full"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None, help="results JSON (default: results/train_step_<model>_<mode>.json)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    cfg, params = load(args.model, args.dtype)
    load_s = time.perf_counter() - t0
    params = unstack_layers(params, cfg.num_layers)
    lora = LoraConfig(args.rank, 2.0 * args.rank)
    trainable = init_lora(cfg, lora, jax.random.PRNGKey(0)) if args.mode == "lora" else params
    frozen = params if args.mode == "lora" else None
    optimizer = make_optimizer(OptimConfig(lr=1e-4, warmup=2, steps=max(args.steps, 3)))
    state = sh.make_state(None, cfg, trainable, args.mode, optimizer)
    frozen = sh.place_frozen(None, cfg, frozen)
    fns = make_steps(
        cfg,
        optimizer,
        mode=args.mode,
        lora_scale=lora.scale if args.mode == "lora" else 1.0,
        max_segments=8,
        dtype=args.dtype,
    )
    plan = BatchPlan(args.batch, (args.length,), 8)
    batches = plan.batches(examples(args.batch * 2 * (args.steps + 1), args.length, cfg.vocab_size), seed=0)
    times, tokens, losses = [], [], []
    for i in range(args.steps + 1):
        b = batches[i % len(batches)]
        arrays = jax.device_put({k: getattr(b, k) for k in BATCH_FIELDS}, jax.devices()[0])
        s = time.perf_counter()
        state, metrics = fns.train(state, frozen, arrays)
        losses.append(float(metrics["loss"]))
        times.append(time.perf_counter() - s)
        tokens.append(b.num_tokens)
    steady = times[1:]
    result = {
        **run_header(),
        "model": args.model,
        "mode": args.mode,
        "dtype": args.dtype,
        "batch_rows": args.batch,
        "row_length": args.length,
        "lora_rank": args.rank if args.mode == "lora" else None,
        "trainable_params": count_params(state.trainable),
        "load_s": round(load_s, 2),
        "first_step_s": round(times[0], 2),
        "step_s": summarize(steady, best=min(steady)),
        "tokens_per_step": round(float(np.mean(tokens[1:])), 1),
        "tokens_per_s": round(sum(tokens[1:]) / sum(steady), 1),
        "loss_first_last": [losses[0], losses[-1]],
        "devices": str(jax.devices()[0].platform),
    }
    print(
        f"{args.model} {args.mode}: {result['tokens_per_s']} tokens/s "
        f"({result['tokens_per_step']} tokens/step, {np.mean(steady):.3f} s/step; first step {times[0]:.1f} s)"
    )
    out = args.out or RESULTS_DIR / f"train_step_{args.model.split('-')[0]}_{args.mode}.json"
    write_results(out, result)


if __name__ == "__main__":
    main()
