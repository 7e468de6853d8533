"""Generation throughput: specrag-jax vs transformers ``generate`` on the same prompts, same machine, same run.

Each (model, engine) pair runs in its own subprocess so peak RSS is per engine and torch and jax never share
a process. Greedy decoding, EOS disabled on both sides, exactly ``--new-tokens`` tokens per sequence.

    python benchmarks/generate.py [--models gemma3-270m,smollm2-135m-instruct] [--batch-sizes 1,5]
                                  [--new-tokens 64] [--repeats 3] [--out benchmarks/results/generate.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (
    PROMPTS,
    RESULTS_DIR,
    OtherLoad,
    RssPhases,
    children_cpu_s,
    cpu_busy_s,
    current_rss_mb,
    loadavg,
    measure_read_bandwidth,
    run_header,
    summarize,
    wait_for_idle,
    write_results,
)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- workers
def quiet(args: argparse.Namespace) -> None:
    """Before a timed repeat, wait a little for other processes to go quiet (best effort)."""
    if args.max_wait > 0:
        wait_for_idle(args.max_busy_cores, args.max_wait / 5, sample_s=1.0)


def worker_ours(args: argparse.Namespace) -> dict[str, Any]:
    """specrag-jax: warm-up generate of the same shapes, then TextModel.generate_ids; prefill = prompt tokens /
    prefill_s (includes the first token); decode = batch * (N-1) / decode_s."""
    import jax

    from specrag_jax.models.sampling.params import SamplingParams
    from specrag_jax.models.text_model import TextModel

    t0 = time.perf_counter()
    model = TextModel.load(args.model, dtype="float32", max_seq_len=args.max_seq_len, max_batch=max(args.batch_sizes))
    load_s = time.perf_counter() - t0
    model.generator.eos_ids = frozenset()  # exactly N tokens per sequence
    rss = RssPhases()
    mem = {"peak_rss_load_mb": rss.phase(), "rss_after_load_mb": current_rss_mb()}
    cfg, params = model.runner.cfg, model.runner.params
    total = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    embed = params["embed"]["embedding"]
    # Per decode step every layer weight and the output projection is read once; with tied embeddings the
    # table *is* the head, otherwise the embedding contributes one row per token.
    weight_bytes = total if cfg.tie_embeddings else total - embed.nbytes + embed.shape[1] * embed.dtype.itemsize
    ids_all = [model.encode_prompt(p) for p in PROMPTS]
    out: dict[str, Any] = {
        "load_s": round(load_s, 2),
        "param_bytes": total,
        "weight_bytes_per_token": weight_bytes,
        "tie_embeddings": cfg.tie_embeddings,
        "prompt_ids": ids_all,
        "batches": {},
    }
    sp = SamplingParams()
    for b in args.batch_sizes:
        ids, n_prompt, steps = ids_all[:b], sum(map(len, ids_all[:b])), b * (args.new_tokens - 1)
        t0 = time.perf_counter()
        model.generate_ids(ids, sp, args.new_tokens)  # warm-up: compiles exactly the shapes timed below
        warm_s, warm_peak = time.perf_counter() - t0, rss.phase()
        pre_s, dec_s, other, tokens = [], [], [], None
        for _ in range(args.repeats):
            quiet(args)
            with OtherLoad() as load:
                res = model.generate_ids(ids, sp, args.new_tokens)
            if any(len(r.token_ids) != args.new_tokens for r in res):
                raise RuntimeError(f"expected {args.new_tokens} tokens, got {[len(r.token_ids) for r in res]}")
            pre_s.append(res[0].prefill_s)
            dec_s.append(res[0].decode_s)
            other.append(load.cores)
            tokens = [r.token_ids for r in res]
        out["batches"][str(b)] = {
            "prompt_tokens": [len(i) for i in ids],
            "warmup_s": round(warm_s, 2),
            "other_cores": other,
            "peak_rss_warmup_mb": warm_peak,
            "peak_rss_timed_mb": rss.phase(),
            "prefill_tokens_per_s": summarize([n_prompt / t for t in pre_s]),
            "decode_tokens_per_s": summarize([steps / t for t in dec_s]),
            "token_ids": tokens,
        }
        _log(f"ours {args.model} b={b}: decode {out['batches'][str(b)]['decode_tokens_per_s']} other {other}")
    rss.phase()
    out.update(peak_rss_mb=rss.overall, final_rss_mb=current_rss_mb(), **mem)
    return out


def worker_hf(args: argparse.Namespace) -> dict[str, Any]:
    """transformers (2 torch threads): warm-up generate(4); per repeat t1 = generate(max_new_tokens=1), tN =
    generate(N) (min_new_tokens=N, left padding + attention_mask, the same token ids as ours); prefill = prompt
    tokens / t1; decode = batch * (N-1) / (tN - t1)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(2)
    path = Path(args.gguf)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    rss = RssPhases()
    mem = {"peak_rss_load_mb": rss.phase(), "rss_after_load_mb": current_rss_mb()}
    ids_all = json.loads(Path(args.ids_file).read_text())
    pad = model.config.pad_token_id or 0
    out: dict[str, Any] = {"load_s": round(load_s, 2), "torch_threads": torch.get_num_threads(), "batches": {}}
    for b in args.batch_sizes:
        ids = ids_all[:b]
        width = max(map(len, ids))
        input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])  # left padding
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])

        def gen(n: int) -> tuple[float, torch.Tensor]:
            t = time.perf_counter()
            with torch.inference_mode():
                o = model.generate(
                    input_ids=input_ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    pad_token_id=pad,
                    eos_token_id=None,
                )
            return time.perf_counter() - t, o[:, width:]

        gen(4)  # warm-up
        warm_peak = rss.phase()
        n_prompt, steps = sum(map(len, ids)), b * (args.new_tokens - 1)
        t1s, tns, other, tokens = [], [], [], None
        for _ in range(args.repeats):
            quiet(args)
            with OtherLoad() as load:
                t1, _ = gen(1)
                tn, o = gen(args.new_tokens)
            if o.shape[1] != args.new_tokens:
                raise RuntimeError(f"expected {args.new_tokens} tokens, got {o.shape[1]}")
            t1s.append(t1)
            tns.append(tn)
            other.append(load.cores)
            tokens = o.tolist()
        out["batches"][str(b)] = {
            "prompt_tokens": [len(i) for i in ids],
            "padded_width": width,
            "other_cores": other,
            "peak_rss_warmup_mb": warm_peak,
            "peak_rss_timed_mb": rss.phase(),
            "t1_s": [round(t, 3) for t in t1s],
            "tN_s": [round(t, 3) for t in tns],
            "prefill_tokens_per_s": summarize([n_prompt / t for t in t1s]),
            "decode_tokens_per_s": summarize(
                [steps / (n - t) if n > t else math.nan for t, n in zip(t1s, tns)],
                best=steps / (min(tns) - min(t1s)) if min(tns) > min(t1s) else None,
            ),
            "token_ids": tokens,
        }
        _log(f"transformers {args.model} b={b}: decode {out['batches'][str(b)]['decode_tokens_per_s']}")
    rss.phase()
    out.update(peak_rss_mb=rss.overall, final_rss_mb=current_rss_mb(), **mem)
    return out


WORKERS = {
    "ours": worker_ours,
    "transformers": worker_hf,
    "bandwidth": lambda args: measure_read_bandwidth(gib=1.0, repeats=5),
}


# ---------------------------------------------------------------------------------------------- driver
def spawn(kind: str, args: argparse.Namespace, **extra: str) -> dict[str, Any]:
    """Run one worker in a fresh interpreter and return its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            kind,
            "--worker-out",
            str(out),
            "--batch-sizes",
            ",".join(map(str, args.batch_sizes)),
            "--new-tokens",
            str(args.new_tokens),
            "--repeats",
            str(args.repeats),
            "--max-seq-len",
            str(args.max_seq_len),
            "--max-wait",
            str(args.max_wait),
            "--max-busy-cores",
            str(args.max_busy_cores),
        ]
        for k, v in extra.items():
            cmd += [f"--{k.replace('_', '-')}", v]
        env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
        idle = wait_for_idle(args.max_busy_cores, args.max_wait) if args.max_wait > 0 else {}
        t0, b0, c0 = time.perf_counter(), cpu_busy_s(), children_cpu_s()
        subprocess.run(cmd, check=True, env=env, timeout=args.worker_timeout)
        wall = time.perf_counter() - t0
        result = json.loads(out.read_text())
        # CPU used by other processes while this worker ran (machine busy time minus the worker's own).
        foreign = (cpu_busy_s() - b0 - (children_cpu_s() - c0)) / wall
        result["process"] = {"wall_s": round(wall, 1), "other_processes_avg_cores": round(max(foreign, 0.0), 2), **idle}
        return result


def _prefix_match(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def compare(ours: dict, hf: dict, bw_gbps: float, batch_sizes: list[int], stat: str) -> dict[str, Any]:
    """Ratios (of the ``stat`` rates), memory-bandwidth bounds and target checks for one model."""
    dec = lambda r, b: r["batches"][str(b)]["decode_tokens_per_s"][stat]  # noqa: E731
    wb = ours["weight_bytes_per_token"]
    bound1 = bw_gbps * 1e9 / wb
    res: dict[str, Any] = {"weight_bytes_per_token": wb, "bandwidth_bound_tokens_per_s_batch1": round(bound1, 2)}
    targets: dict[str, bool] = {}
    if 1 in batch_sizes:
        res["ours_decode_fraction_of_bound_batch1"] = _ratio(dec(ours, 1), bound1)
        res["decode_speedup_batch1"] = r1 = _ratio(dec(ours, 1), dec(hf, 1))
        targets["decode_batch1_ge_1.5x_transformers_batch1"] = r1 is not None and r1 >= 1.5
        a, b = ours["batches"]["1"]["token_ids"][0], hf["batches"]["1"]["token_ids"][0]
        res["greedy_prefix_match_batch1"] = f"{_prefix_match(a, b)}/{len(a)}"
    for b in (x for x in batch_sizes if x > 1):
        res[f"bandwidth_bound_aggregate_tokens_per_s_batch{b}"] = round(b * bound1, 2)
        same = _ratio(dec(ours, b), dec(hf, b))
        res[f"decode_speedup_batch{b}_aggregate_vs_transformers_batch{b}_aggregate"] = same
        targets[f"decode_batch{b}_aggregate_ge_5x_transformers_batch{b}_aggregate"] = same is not None and same >= 5
        if 1 in batch_sizes:
            vs1 = _ratio(dec(ours, b), dec(hf, 1))
            res[f"decode_speedup_batch{b}_aggregate_vs_transformers_batch1"] = vs1
            targets[f"decode_batch{b}_aggregate_ge_5x_transformers_batch1"] = vs1 is not None and vs1 >= 5
    res["targets_met"] = targets
    return res


def table(results: dict[str, Any]) -> str:
    """A short human-readable summary."""
    stat = results["settings"]["stat"]
    rows = [
        f"{'model':24} {'engine':13} {'batch':>5} {'prompt':>7} {'prefill/s':>10} {'decode/s':>9} "
        f"{'peakRSS MB':>10} {'timed peak':>10} {'other cores':>11}"
    ]
    for model, m in results["models"].items():
        for engine in ("ours", "transformers"):
            e = m[engine]
            for b, r in e["batches"].items():
                pre, dec = r["prefill_tokens_per_s"][stat] or 0, r["decode_tokens_per_s"][stat] or 0
                rows.append(
                    f"{model:24} {engine:13} {b:>5} {sum(r['prompt_tokens']):>7} {pre:>10.1f} {dec:>9.2f} "
                    f"{e['peak_rss_mb']:>10.0f} {r['peak_rss_timed_mb']:>10.0f} "
                    f"{max(r['other_cores']):>11.2f}"
                )
        c = m["comparison"]
        rows.append("  " + ", ".join(f"{k}={v}" for k, v in c.items() if k != "targets_met"))
        rows.append("  targets_met: " + ", ".join(f"{k}={v}" for k, v in c["targets_met"].items()))
    bw = results["bandwidth"]
    rows.append(
        f"read bandwidth GB/s: numpy {bw.get('numpy_sum_gbps')}, jax {bw.get('jax_sum_gbps')} "
        f"(bound uses max {bw['max_gbps']}); rates are {stat} of {results['settings']['repeats']} runs; "
        "other cores = most CPU cores other processes used during one timed repeat"
    )
    return "\n".join(rows)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gemma3-270m,smollm2-135m-instruct")
    p.add_argument("--batch-sizes", default="1,5")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--stat",
        choices=("best", "median"),
        default="best",
        help="headline statistic over repeats (best resists load from other processes)",
    )
    p.add_argument("--max-seq-len", type=int, default=512, help="context (KV pool size) for specrag-jax")
    p.add_argument("--out", default=str(RESULTS_DIR / "generate.json"))
    p.add_argument("--worker-timeout", type=int, default=900)
    p.add_argument(
        "--max-wait",
        type=float,
        default=120.0,
        help="seconds to wait, before each engine, for other processes to go quiet (0 = no wait)",
    )
    p.add_argument("--max-busy-cores", type=float, default=0.3, help="'quiet' means fewer busy cores than this")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--gguf", help=argparse.SUPPRESS)
    p.add_argument("--ids-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.batch_sizes = [int(x) for x in str(args.batch_sizes).split(",") if x]
    args.models = [m for m in args.models.split(",") if m]
    if max(args.batch_sizes) > len(PROMPTS) or args.new_tokens < 2:
        p.error(f"batch sizes must be <= {len(PROMPTS)} and --new-tokens >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        Path(args.worker_out).write_text(json.dumps(WORKERS[args.worker](args)))
        return 0
    from specrag_jax.models.loading.registry import resolve_model_path

    t_start = time.perf_counter()
    results: dict[str, Any] = run_header()
    results["loadavg_start"] = loadavg()
    results["settings"] = {
        "batch_sizes": args.batch_sizes,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "stat": args.stat,
        "stat_note": "headline rates/ratios use this; median, best and all runs are listed "
        "(transformers 'best' decode = (min tN - min t1))",
        "greedy": True,
        "eos": "disabled",
        "dtype": "float32 (GGUF weights dequantized)",
        "ours_max_seq_len": args.max_seq_len,
        "prompts": PROMPTS[: max(args.batch_sizes)],
        "method": {
            "ours": worker_ours.__doc__,
            "transformers": worker_hf.__doc__,
            "bandwidth_bound": "max measured read bandwidth / weight bytes read per decode step "
            "(all layers + output head)",
        },
    }
    _log("measuring read bandwidth")
    results["bandwidth"] = spawn("bandwidth", args)
    results["models"] = {}
    for name in args.models:
        _log(f"{name}: specrag-jax")
        ours = spawn("ours", args, model=name)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(ours.pop("prompt_ids"), f)
        try:
            _log(f"{name}: transformers")
            hf = spawn("transformers", args, model=name, gguf=str(resolve_model_path(name)), ids_file=f.name)
        finally:
            os.unlink(f.name)
        comp = compare(ours, hf, results["bandwidth"]["max_gbps"], args.batch_sizes, args.stat)
        results["models"][name] = {"ours": ours, "transformers": hf, "comparison": comp}
    results["loadavg_end"] = loadavg()
    results["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    results["targets_met"] = {
        f"{m}: {k}": v for m, r in results["models"].items() for k, v in r["comparison"]["targets_met"].items()
    }
    path = write_results(args.out, results)
    print(table(results))
    print(
        f"wrote {path} in {results['total_wall_s']} s; loadavg start {results['loadavg_start']} "
        f"end {results['loadavg_end']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
