"""Decode attention's two loop schedules on a real model's whole decode steps: packed (row, block) pairs against
every row reading the longest row's key blocks in lockstep (``kernels.decode_blocked.PACKED_DECODE`` off).

A server's decode batch holds sequences of very different lengths (a 3,000-token conversation beside short
ones); in lockstep every row pays for the longest. Here SmolLM2-135M-Instruct (real weights, no adapter)
continues a batch of prompts cut from this repository's README to the lengths of each of ``--workloads`` (``ragged``: a
server-like mix; ``equal``: the control, where both schedules read the same blocks), greedy, ``--new-tokens``
each. Per round both schedules run in one process in alternating order, each after dropping the traced
programs, compiling (one untimed pass) and timing one pass; every engine step is timed (``drafting_steps``'s
recorder) and the decode steps' wall time is compared. Greedy tokens must be identical (asserted).
``--switch heads`` compares the block products' head forms instead (``decode_blocked.STACKED_HEADS``: all KV
heads side by side against batched per KV head), ``long`` adds four 2,000-token sequences. The
schedule A/B runs in the stacked form (``decode_schedule.json`` was measured in the grouped one).

    python benchmarks/decode_schedule.py --out benchmarks/results/decode_schedule.json
    python benchmarks/decode_schedule.py --switch heads --workloads ragged,equal,long \
        --out benchmarks/results/decode_stacked_heads.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import run_header, write_results
from benchmarks.drafting_steps import recorded_steps

WORKLOADS = {
    "ragged": [60, 90, 150, 200, 300, 400, 3000, 120],
    "equal": [400] * 8,
    "long": [2000] * 4,
}
SWITCHES = {  # --switch: the ``decode_blocked`` flag it flips and its (on, off) sides
    "schedule": ("PACKED_DECODE", ("packed", "lockstep")),
    "heads": ("STACKED_HEADS", ("stacked", "grouped")),
}


def prompts_of(tokenizer, lens: list[int]) -> list[list[int]]:
    """Token prompts of the given lengths, cut from the README at different offsets."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = tokenizer.encode(text)
    while len(ids) < max(lens) + 64 * len(lens):
        ids = ids + ids
    return [ids[64 * i : 64 * i + n] for i, n in enumerate(lens)]


def main(argv: list[str] | None = None) -> int:
    import jax

    from specrag_jax.kernels import decode_blocked
    from specrag_jax.machine_peaks import measure_peaks
    from specrag_jax.models.text_model import TextModel

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="ragged,equal")
    p.add_argument("--switch", choices=sorted(SWITCHES), default="schedule")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    model = TextModel.load("smollm2-135m-instruct", max_seq_len=4096, max_batch=8)
    peaks = measure_peaks()
    log: list[dict] = []
    undo = recorded_steps(log)
    flag, sides = SWITCHES[args.switch]
    new, old = sides
    result = {**run_header(), "peaks": peaks.to_dict(), "new_tokens": args.new_tokens, "switch": flag, "workloads": {}}
    try:
        for name in args.workloads.split(","):
            prompts = prompts_of(model.tokenizer, WORKLOADS[name])
            decode_s: dict[str, list[float]] = {side: [] for side in sides}
            step_ms: dict[str, list[float]] = {side: [] for side in sides}
            tokens = {}
            for r in range(args.rounds):
                for side in sides if r % 2 == 0 else sides[::-1]:
                    setattr(decode_blocked, flag, side == new)  # a trace-time switch
                    jax.clear_caches()
                    model.generator.generate(prompts, max_new_tokens=args.new_tokens)  # compiles
                    log.clear()
                    out = model.generator.generate(prompts, max_new_tokens=args.new_tokens)
                    steps = [e["s"] for e in log if e["decode"]]
                    decode_s[side].append(sum(steps))
                    step_ms[side] += [1e3 * s for s in steps]
                    tokens.setdefault(side, [o.token_ids for o in out])
                    print(name, side, f"round {r}: decode {sum(steps):.3f} s in {len(steps)} steps", flush=True)
            assert tokens[new] == tokens[old], f"{name}: greedy tokens differ between {new} and {old}"
            med = {side: statistics.median(step_ms[side]) for side in sides}
            result["workloads"][name] = {
                "cached_tokens": WORKLOADS[name],
                "decode_s_per_round": decode_s,
                "decode_step_ms_median": med,
                f"{new}_over_{old}_step_median": med[new] / med[old],
                f"{new}_over_{old}_decode_total": sum(decode_s[new]) / sum(decode_s[old]),
                "tokens_identical": True,
            }
            print(name, {k: round(v, 3) for k, v in result["workloads"][name].items() if "over" in k}, flush=True)
    finally:
        undo()
        decode_blocked.PACKED_DECODE = decode_blocked.STACKED_HEADS = True
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
