"""Warm-up: compile every step shape an engine can reach before it serves, so no request waits on XLA.

An engine step's program is keyed by its padded shape: tokens T, sequences S, page-table width P, wanted
rows R, and whether it is a decode step, a token tree, or greedy-only sampling. Under the engine's
scheduler config these shapes form a small, known set:

- decode steps: S in the sequence buckets up to ``max_running`` (``SchedulerConfig.decode_rows``), T = S;
- sampling steps with prefill chunks: T in the token buckets up to ``token_budget``, S <= T, R = S;
- scoring steps (verification trees): T up to ``token_budget``, R <= T, S = ``score_step_seqs``;
- speculation steps (``spec_budget`` given): S in the sequence buckets, a tree budget B in ``TREE_BUDGETS``
  up to ``spec_budget`` with S x B <= ``token_budget`` (backpressure's rule), T = S x B.

Each is run once on throw-away chunks (``write=False`` on the null page, so no pool state changes).
With a persistent compilation cache (``enable_compile_cache``) a restart loads the programs from disk.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Iterable

from specrag_jax.compile_time import CompileClock
from specrag_jax.errors import SpecRagError
from specrag_jax.kernels import NULL_PAGE
from specrag_jax.models.engine.state import EngineView
from specrag_jax.models.executor.packing import Chunk, bucket, seq_count_buckets, token_count_buckets
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.tree import TREE_BUDGETS, build_tree, check_budget, stack_trees
from specrag_jax.xla_cache import default_xla_cache_dir, enable_xla_cache

WARMUP_LEVELS = ("none", "decode", "full")


@dataclasses.dataclass(frozen=True)
class StepShape:
    kind: str  # "decode" | "prefill" (sampling step with prefill chunks) | "score" | "speculate"
    tokens: int
    seqs: int
    pages: int
    rows: int
    greedy: bool = True


@dataclasses.dataclass
class WarmupReport:
    programs: int
    seconds: float
    compile_seconds: float

    def as_dict(self) -> dict:
        return {
            "programs": self.programs,
            "seconds": round(self.seconds, 2),
            "compile_seconds": round(self.compile_seconds, 2),
        }


def _powers(lo: int, hi: int) -> list[int]:
    out, n = [], bucket(lo)
    while n <= max(hi, lo):
        out.append(n)
        n *= 2
    return out


def step_shapes(
    engine: EngineView, level: str = "full", sampled: bool = True, score: bool = True, spec_budget: int | None = None
) -> list[StepShape]:
    """The step shapes ``engine`` can run under its config: ``level`` "decode" = decode steps only; ``sampled``
    adds the sampling (non-greedy) programs; ``score`` adds verification-tree scoring (verifier engines);
    ``spec_budget`` adds the speculation steps of token trees up to that budget (at either level)."""
    if level not in WARMUP_LEVELS:
        raise SpecRagError(f"unknown warm-up level {level!r}; choose one of {', '.join(WARMUP_LEVELS)}")
    if level == "none":
        return []
    r, cfg = engine.runner, engine.config
    pages = _powers(r.min_page_bucket, bucket(r.max_pages_per_seq))
    seqs = _powers(cfg.min_step_seqs, cfg.max_running)  # prefill and mixed steps
    rows = sorted({cfg.decode_rows(n) for n in seq_count_buckets(cfg.max_running)}) if cfg.fine_buckets else seqs
    greedy = (True, False) if sampled else (True,)
    shapes = [StepShape("decode", s, s, p, s, g) for s in rows for p in pages for g in greedy]
    if spec_budget is not None:
        check_budget(spec_budget)
        shapes += [
            StepShape("speculate", s * b, s, p, s, g)
            for b in TREE_BUDGETS
            if b <= spec_budget
            for s in rows
            if s * b <= cfg.token_budget
            for p in pages
            for g in greedy
        ]
    if level == "full":
        tokens = sorted({cfg.step_tokens(t) for t in token_count_buckets(cfg.min_step_tokens, cfg.token_budget)})
        shapes += [
            StepShape("prefill", t, s, p, s, g) for t in tokens for s in seqs if s <= t for p in pages for g in greedy
        ]
        if score:
            shapes += [
                StepShape("score", t, cfg.score_step_seqs, p, rows)
                for t in tokens
                for rows in _powers(cfg.score_step_seqs, t)
                for p in pages
            ]
    return shapes


def _run_shape(engine: EngineView, shape: StepShape) -> None:
    r = engine.runner
    null = [NULL_PAGE] * shape.pages
    if shape.kind == "decode":
        chunks = [Chunk(null, 0, [0], write=False, rows=[0])] * shape.seqs
        step = r.pack(chunks, token_bucket=shape.tokens, min_seqs=shape.seqs)
    elif shape.kind == "prefill":
        chunks = [Chunk(null, 0, [0, 0], write=False, rows=[1])] + [Chunk(null, 0, [0], write=False, rows=[0])] * (
            shape.seqs - 1
        )
        step = r.pack(chunks, token_bucket=shape.tokens, min_seqs=shape.seqs)
    elif shape.kind == "speculate":
        tree = build_tree([], 0, shape.tokens // shape.seqs)  # a root alone: only the shapes matter
        chunks = [Chunk(null, 0, tree.tokens, parents=tree.parents, positions=tree.positions(0), write=False)]
        step = r.pack(chunks * shape.seqs, token_bucket=shape.tokens, min_seqs=shape.seqs)
        n = shape.seqs
        r.speculate(step, stack_trees([tree] * n), _rows(shape.greedy, n))
        return
    else:
        chunk = Chunk(null, 0, [0, 0], parents=[-1, -1], positions=[0, 0], write=False, rows=[0] * shape.rows)
        step = r.pack([chunk], token_bucket=shape.tokens, min_seqs=shape.seqs)
        r.score(step, [0] * shape.rows)
        return
    n = step.num_rows
    r.sample(step, _rows(shape.greedy, n))


def _rows(greedy: bool, n: int) -> SamplingBatch:
    """``n`` warm-up rows: greedy or sampled (the two programs of each shape)."""
    return SamplingBatch.of([SamplingParams(temperature=0.0 if greedy else 1.0)] * n, [0] * n)


# Measured on this CPU: XLA maps ~300 memory regions per compiled SmolLM2 step program, ~410 per Gemma 3 one.
MAPS_PER_PROGRAM = 450


def memory_mappings(maps_path: str = "/proc/self/maps") -> int | None:
    """Memory regions this process maps (Linux), or None where that cannot be read."""
    try:
        with open(maps_path) as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def check_map_budget(
    programs: int,
    limit_path: str = "/proc/sys/vm/max_map_count",
    maps_path: str = "/proc/self/maps",
    fraction: float = 0.8,
) -> None:
    """On CPU, refuse a warm-up whose compiled programs would use up the process's memory mappings.

    XLA's CPU backend maps every compiled program's code in hundreds of regions; past Linux's
    ``vm.max_map_count`` (65530 by default) the next compilation fails inside LLVM with "Cannot allocate
    memory" and the server dies (seen here with 165 warmed-up programs)."""
    import jax

    if jax.default_backend() != "cpu":
        return
    try:
        limit = int(Path(limit_path).read_text())
    except (OSError, ValueError):
        return  # not Linux: no such limit to check
    used = memory_mappings(maps_path)
    if used is None:
        return
    need = programs * MAPS_PER_PROGRAM
    if used + need > fraction * limit:
        raise SpecRagError(
            f"warming up {programs} programs needs about {need} memory mappings on the CPU backend "
            f"({used} in use) but vm.max_map_count is {limit}: raise it (sysctl -w vm.max_map_count=262144) "
            f"or warm up less (--warmup decode, no --warmup-sampling, a smaller --max-running or --max-seq-len)"
        )


def warmup(
    engine: EngineView,
    level: str = "full",
    sampled: bool = True,
    score: bool = True,
    shapes: Iterable[StepShape] | None = None,
    spec_budget: int | None = None,
) -> WarmupReport:
    """Compile (run once) every step shape of ``step_shapes``; call before the engine serves."""
    if engine.started:
        raise SpecRagError(f"warm up engine {engine.name} before start(): its loop owns the runner's pool")
    todo = list(step_shapes(engine, level, sampled, score, spec_budget) if shapes is None else shapes)
    t0 = time.perf_counter()
    with CompileClock() as clock:
        for shape in todo:
            _run_shape(engine, shape)
        engine.runner.penalties.warm(
            [s.seqs for s in todo if s.kind in ("decode", "prefill")],
            [(s.seqs, s.tokens // s.seqs) for s in todo if s.kind == "speculate"],
        )
    report = WarmupReport(len(todo), time.perf_counter() - t0, clock.seconds)
    engine.counters["warmup_programs"] += report.programs
    engine.counters["warmup_s"] += round(report.seconds, 2)
    return report


def default_compile_cache() -> Path:
    """The persistent XLA cache folder shared with the other commands (``xla_cache.default_xla_cache_dir``)."""
    return default_xla_cache_dir()


def enable_compile_cache(path: str | Path) -> Path:
    """Persist compiled programs under ``path`` (JAX's compilation cache): a restarted server reloads them."""
    return enable_xla_cache(path)
