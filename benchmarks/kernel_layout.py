"""Dense kernels ``[out, in]`` and the few-rows product form, against the ``[in, out]`` layout they replace.

Two parts, one process, same machine state:
1. Matrix level, for every distinct projection shape of the default pair (SmolLM2-135M, Qwen2.5-1.5B) and rows
   1-512: before = ``x @ W`` with ``W`` stored ``[in, out]`` (what ``nn.Dense`` did), after = ``project(x, W)``
   with ``W`` stored ``[out, in]`` (``models/decoder/linear.py``). Best of ``--repeats`` timings of ``--calls``
   calls each.
2. Whole steps of the real models through their runners (real weights): one-token decode, a decode batch of
   5 rows (drafting), a 16-token tree step (lossless decoding), a 512-token prefill chunk, with the few-rows
   form on against off (off = the plain ``x @ W.T`` on the same ``[out, in]`` weights), alternating
   off, on, on, off after one warm-up of each; every round retraces (``jax.clear_caches``) and compiles before
   it times. Greedy tokens of the decode steps must agree between the sides (asserted). ``--knob
   small-kernel-rows`` instead switches the rule for matrices under 4 MiB between the earlier rule (the form at one row
   only) and today's (up to ``SMALL_KERNEL_ROWS`` rows); ``--knob head-form`` the output head's form alone;
   ``--knob pad-rows`` few-rows products of 5-7 rows at 8 (``linear.PADDED_ROWS``) against at their own count.
3. With ``--before-tree DIR`` (a checkout of the code before, e.g. ``git worktree add DIR HEAD~1``): the same
   steps on that code (its ``[in, out]`` kernels) against this code, each side in fresh processes alternating
   before, after, after, before (``--rounds`` per side), the before side with its own ``--before-cache`` (the
   converted-weights cache formats differ). Greedy tokens must agree.

    python benchmarks/kernel_layout.py --out benchmarks/results/kernel_layout.json
    python benchmarks/kernel_layout.py --models smollm2-135m-instruct --skip-matrices --knob small-kernel-rows \
        --context 300 --out benchmarks/results/kernel_layout_small_kernel_rows.json
    python benchmarks/kernel_layout.py --models qwen2.5-coder-1.5b-instruct --skip-matrices --knob head-form \
        --out benchmarks/results/kernel_layout_head_form.json
    python benchmarks/kernel_layout.py --skip-matrices --knob pad-rows --rounds 4 \
        --out benchmarks/results/kernel_layout_pad_rows.json
    python benchmarks/kernel_layout.py --before-tree ../before --before-cache /tmp/before-cache --skip-matrices \
        --out benchmarks/results/kernel_layout_before_after.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import alternate_off_on, run_header, write_results
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.speculative.tree import build_tree, stack_trees

MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct")
ROWS = (1, 5, 8, 16, 32, 64, 128, 512)


def _best_ms(fn, *args, calls: int, repeats: int) -> float:
    fn(*args).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - t) / calls * 1e3)
    return best


def matrix_shapes(cfg) -> dict[str, tuple[int, int]]:
    """Distinct ``(in, out)`` projection shapes of one model."""
    h, d = cfg.hidden_size, cfg.head_dim
    return {
        "q/o": (h, cfg.num_heads * d),
        "k/v": (h, cfg.num_kv_heads * d),
        "gate/up": (h, cfg.intermediate_size),
        "down": (cfg.intermediate_size, h),
    }


def matrix_level(configs: dict, rows: tuple[int, ...], calls: int, repeats: int) -> list[dict]:
    """Before/after milliseconds of every projection shape of ``configs`` (name -> ModelConfig) per row count."""
    from specrag_jax.models.decoder import linear  # not in the code before (``--before-tree`` runs this file there)

    before = jax.jit(lambda x, w: x @ w)
    after = jax.jit(linear.project)
    rng = np.random.default_rng(0)
    out = []
    for name, cfg in configs.items():
        for what, (n_in, n_out) in matrix_shapes(cfg).items():
            w = rng.standard_normal((n_in, n_out), dtype=np.float32)
            w_in_out, w_out_in = jnp.asarray(w), jnp.asarray(np.ascontiguousarray(w.T))
            for r in rows:
                x = jnp.asarray(rng.standard_normal((r, n_in), dtype=np.float32))
                np.testing.assert_allclose(before(x, w_in_out), after(x, w_out_in), rtol=2e-4, atol=2e-3)
                n = max(1, calls // max(1, r // 16))
                b = _best_ms(before, x, w_in_out, calls=n, repeats=repeats)
                a = _best_ms(after, x, w_out_in, calls=n, repeats=repeats)
                out.append(
                    {
                        "model": name,
                        "matrix": what,
                        "in": n_in,
                        "out": n_out,
                        "rows": r,
                        "before_ms": round(b, 4),
                        "after_ms": round(a, 4),
                        "speedup": round(b / a, 3),
                    }
                )
                print(
                    f"{name:28s} {what:8s} {n_in}x{n_out} rows {r:4d}: {b:8.3f} -> {a:8.3f} ms ({b / a:.2f}x)",
                    flush=True,
                )
    return out


def step_timer(model, context: int, repeats: int):
    """Closures timing each step kind of ``model``'s runner after ``context`` cached tokens (seconds, best of
    ``repeats``, the first call compiling) and the greedy tokens they produced."""
    r = model.runner
    rng = np.random.default_rng(1)
    ids = rng.integers(100, r.cfg.vocab_size - 100, context + 512).tolist()
    seqs = [r.allocator.allocate(-(-(context + 600) // r.page_size)) for _ in range(5)]
    for pages in seqs:
        r.score(r.pack([Chunk(pages, 0, ids[:context], rows=[context - 1])]), [0])

    def best(fn):
        first = fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times), first

    def decode(width: int):
        chunks = [Chunk(seqs[i], context, [ids[context + i]], rows=[0]) for i in range(width)]
        return lambda: np.asarray(
            r.sample(r.pack(chunks, token_bucket=width), SamplingBatch.greedy(width)).ids
        ).tolist()

    def tree_step():
        props = [rng.integers(0, r.cfg.vocab_size, 3).tolist() for _ in range(5)]
        tree = build_tree(props, ids[context], 16)
        chunk = Chunk(seqs[0], context, tree.tokens, parents=tree.parents, positions=tree.positions(context))
        return lambda: r.speculate(r.pack([chunk], token_bucket=16), stack_trees([tree]), SamplingBatch.greedy(1))

    def prefill():
        chunk = Chunk(seqs[1], context, ids[context : context + 512], rows=[511])
        return lambda: np.asarray(r.score(r.pack([chunk]), [0])).tolist()

    kinds = {"decode_1": decode(1), "decode_5": decode(5), "tree_16": tree_step(), "prefill_512": prefill()}

    def run() -> tuple[dict[str, float], dict[str, list]]:
        times, tokens = {}, {}
        for kind, fn in kinds.items():
            times[kind], first = best(fn)
            if kind.startswith("decode"):
                tokens[kind] = first
        return times, tokens

    def release() -> None:
        for pages in seqs:
            r.allocator.release(pages)

    return run, release


def paired(run, rounds: int, name: str, sides: tuple[str, str]) -> dict:
    """``common.alternate_off_on`` over ``run(on) -> {"times", "tokens"}``: greedy tokens must agree between the two
    sides (named ``sides``, off first); medians of the timed runs per side and the speedup of ``sides[1]``."""

    def logged(on: bool) -> dict:
        result = run(on)
        times = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in result["times"].items())
        print(f"{name} {sides[on]}: {times}", flush=True)
        return result

    warm, _, runs = alternate_off_on(logged, rounds)
    assert warm["off"]["tokens"] == warm["on"]["tokens"], (name, warm)
    times = {sides[on]: [r["times"] for r in runs["on" if on else "off"]] for on in (False, True)}
    med = {side: {k: statistics.median(t[k] for t in ts) for k in ts[0]} for side, ts in times.items()}
    return {
        "median_s": med,
        "speedup": {k: round(med[sides[0]][k] / med[sides[1]][k], 3) for k in med[sides[1]]},
        "runs_s": times,
        "greedy_tokens_equal": True,
    }


# The step-level A/Bs: a switch of models/decoder/linear.py, its (off, on) values and the sides' names.
KNOBS = {
    "form": ("FEW_ROWS_FORM", (False, True), ("off", "on")),
    # the earlier rule (one row only for matrices under LARGE_KERNEL_BYTES) against today's SMALL_KERNEL_ROWS
    "small-kernel-rows": ("SMALL_KERNEL_ROWS", (1, None), ("one_row", "small_kernel_rows")),
    "head-form": ("HEAD_FEW_ROWS_FORM", (False, True), ("head_plain", "head_form")),  # the output head only
    # few-rows products of 5-7 / 9-15 rows at their own row count against padded to 8 / 16 (PADDED_ROWS)
    "pad-rows": ("PAD_FEW_ROWS", (False, True), ("exact_rows", "padded_rows")),
}


def step_level(model, name: str, context: int, rounds: int, repeats: int, knob: str = "form") -> dict:
    """``knob``'s two settings against each other, per step kind of ``model`` (medians over the timed rounds)."""
    from specrag_jax.models.decoder import linear

    attr, values, sides = KNOBS[knob]
    saved = getattr(linear, attr)
    values = tuple(saved if v is None else v for v in values)
    run, release = step_timer(model, context, repeats)

    def with_setting(on: bool) -> dict:
        setattr(linear, attr, values[on])
        jax.clear_caches()
        times, tokens = run()
        return {"times": times, "tokens": tokens}

    try:
        result = paired(with_setting, rounds, name, sides)
        return {"context_tokens": context, "knob": attr, "values": dict(zip(sides, values)), **result}
    finally:
        setattr(linear, attr, saved)
        release()


def steps_once(name: str, context: int, repeats: int) -> dict:
    """This process's code: load ``name`` and time each step kind once after its compile."""
    from specrag_jax.models.text_model import TextModel

    model = TextModel.load(name, max_seq_len=2048, max_batch=8)
    run, release = step_timer(model, context, repeats)
    try:
        times, tokens = run()
    finally:
        release()
    return {"times": times, "tokens": tokens}


def _spawn(tree: Path, name: str, args: argparse.Namespace, cache: str | None) -> dict:
    script = tree / "benchmarks" / Path(__file__).name
    cmd = [sys.executable, str(script), "--steps-once", name, "--context", str(args.context)]
    env = {**os.environ, "PYTHONPATH": str(tree), **({"SPECRAG_CACHE_DIR": cache} if cache else {})}
    proc = subprocess.run(cmd + ["--repeats", str(args.repeats)], env=env, cwd=tree, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{script} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def before_after(names: list[str], args: argparse.Namespace) -> dict:
    """Each step kind on the code of ``--before-tree`` against this code, fresh processes alternating."""
    before = Path(args.before_tree).resolve()
    shutil.copy(__file__, before / "benchmarks" / Path(__file__).name)  # the same timing code on both sides
    after = Path(__file__).resolve().parent.parent

    def spawn(name: str):
        return lambda on: _spawn(after, name, args, None) if on else _spawn(before, name, args, args.before_cache)

    # one warm-up process per side (the weights cache, the page cache), then the timed ones
    return {name: paired(spawn(name), args.rounds, name, ("before", "after")) for name in names}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per side of the step-level A/Bs")
    p.add_argument("--context", type=int, default=600, help="cached tokens before the timed steps")
    p.add_argument("--skip-steps", action="store_true")
    p.add_argument("--skip-matrices", action="store_true")
    p.add_argument("--knob", choices=sorted(KNOBS), default="form", help="what the step-level A/B switches")
    p.add_argument("--before-tree", help="a checkout of the code before: compare whole steps against it")
    p.add_argument("--before-cache", help="SPECRAG_CACHE_DIR for the --before-tree side")
    p.add_argument("--steps-once", help=argparse.SUPPRESS)
    p.add_argument("--out", default="benchmarks/results/kernel_layout.json")
    args = p.parse_args(argv)
    if args.steps_once:
        print("RESULT " + json.dumps(steps_once(args.steps_once, args.context, args.repeats)), flush=True)
        return 0
    names = [n for n in args.models.split(",") if n]
    payload = {**run_header()}
    if args.before_tree:
        payload["before_tree_commit"] = subprocess.run(
            ["git", "-C", args.before_tree, "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        payload["before_after"] = before_after(names, args)
    else:
        from specrag_jax.models.decoder import linear
        from specrag_jax.models.text_model import TextModel

        rows = tuple(int(r) for r in args.rows.split(","))
        payload.update(
            small_rows=linear.SMALL_ROWS,
            large_kernel_bytes=linear.LARGE_KERNEL_BYTES,
            small_kernel_rows=linear.SMALL_KERNEL_ROWS,
        )
        payload["platform"] = jax.default_backend()
        payload["matrices"], payload["steps"] = [], {}
        for name in names:
            model = TextModel.load(name, max_seq_len=2048, max_batch=8)
            if not args.skip_matrices:
                payload["matrices"] += matrix_level({name: model.runner.cfg}, rows, args.calls, args.repeats)
            if not args.skip_steps:
                payload["steps"][name] = step_level(model, name, args.context, args.rounds, args.repeats, args.knob)
            del model
    print(f"wrote {write_results(args.out, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
