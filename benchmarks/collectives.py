"""Collectives each sharded jitted step compiles to (count and bytes, read from the compiled HLO).

For each model and mesh spec, the runner's step bodies are lowered with abstract (shape-only) parameters
and pool carrying their NamedShardings, compiled for N host CPU devices, and the partitioned HLO is
scanned for all-reduce / all-gather / reduce-scatter / all-to-all / collective-permute. No weights are
loaded (configs come from the GGUF headers), so a sharding regression shows without hardware.

Steps: prefill (one 256-token causal chunk, sample), tree score (verification: 5 branches of 24 tokens after
a 256-token cached prefix, one packed tree chunk, log-probs), decode (8 sequences x 1 token, sample).

MoE row: ``--models mixtral-8x7b-2l`` (Mixtral-8x7B's shapes, 2 of its 32 layers, from ``SHAPE_ONLY``; no file
needed), e.g. ``--models mixtral-8x7b-2l --out benchmarks/results/collectives_moe.json``.

Usage: python benchmarks/collectives.py [--models gemma3-270m,smollm2-135m-instruct]
       [--specs "model=8;data=2,model=4;model=2;model=8/experts=model"] [--out benchmarks/results/collectives.json]
(a spec's "/k=v" suffixes override axis rules, e.g. ``/experts=model`` for expert parallelism)
(sets XLA_FLAGS=--xla_force_host_platform_device_count=8 itself when XLA_FLAGS is unset)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if "XLA_FLAGS" not in os.environ:  # before JAX starts
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import functools

import jax
import jax.numpy as jnp

from benchmarks.common import RESULTS_DIR, run_header, write_results
from specrag_jax.models.config import ModelConfig, param_shapes
from specrag_jax.models.executor.packing import Chunk, pack_chunks
from specrag_jax.models.executor.runner import _BODIES
from specrag_jax.parallel import Placement, make_mesh, parse_mesh_spec
from specrag_jax.parallel.hlo import collective_stats
from specrag_jax.parallel.rules import DEFAULT_RULES

PAGE_SIZE, NUM_PAGES, MAX_PAGES = 16, 256, 32


# Shape-only configs (no checkpoint on disk): Mixtral-8x7B's layer shapes, with 2 of its 32 layers.
SHAPE_ONLY = {
    "mixtral-8x7b-2l": dict(
        arch="mixtral",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=2,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=1e6,
        tie_embeddings=False,
        num_experts=8,
        experts_per_token=2,
    )
}


def model_config(name: str) -> ModelConfig:
    """The config from the GGUF header only (no tensors read), or a ``SHAPE_ONLY`` entry."""
    from specrag_jax.models.loading.gguf_loader import gguf_config, open_gguf

    if name in SHAPE_ONLY:
        return ModelConfig(**SHAPE_ONLY[name], name=name)
    from specrag_jax.models.loading.registry import resolve_model_path

    path = resolve_model_path(name)
    return gguf_config(open_gguf(path), path)


def abstract_params(cfg: ModelConfig, dtype) -> dict:
    """Shape-only parameters in the runner's per-layer layout (``unstack_layers``)."""
    tree = param_shapes(cfg)
    sds = lambda s: jax.ShapeDtypeStruct(s, dtype)  # noqa: E731
    is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
    out = {k: jax.tree_util.tree_map(sds, v, is_leaf=is_shape) for k, v in tree.items() if k != "layers"}
    for i in range(cfg.num_layers):
        out[f"layers_{i}"] = jax.tree_util.tree_map(lambda s: sds(s[1:]), tree["layers"], is_leaf=is_shape)
    return out


def steps() -> dict[str, tuple[str, object, tuple]]:
    """Name -> (body kind, packed step, extra inputs after rows) with realistic metadata."""
    import numpy as np

    pack = functools.partial(
        pack_chunks,
        page_size=PAGE_SIZE,
        num_slots=NUM_PAGES * PAGE_SIZE,
        min_token_bucket=16,
        min_page_bucket=16,
        max_page_bucket=MAX_PAGES,
    )
    prefill = pack([Chunk(list(range(1, 17)), 0, list(range(10, 266)), rows=[255])])
    parents, positions = [], []
    for b in range(5):
        parents += [-1] + [b * 24 + j for j in range(23)]
        positions += list(range(256, 280))
    tree = pack(
        [
            Chunk(
                list(range(1, 19)),
                256,
                list(range(10, 130)),
                parents=parents,
                positions=positions,
                write=False,
                rows=list(range(120)),
            )
        ]
    )
    decode = pack([Chunk([1 + 20 * s + j for j in range(8)], 100, [7], rows=[0]) for s in range(8)])

    def sample_extra(step):
        r = step.rows.shape[0]
        return (
            np.zeros(r, np.float32),
            np.zeros(r, np.int32),
            np.ones(r, np.float32),
            np.zeros(r, np.uint32),
            np.zeros(r, np.int32),
        )

    return {
        "prefill": ("sample", prefill, sample_extra(prefill)),
        "tree_score": ("score", tree, (np.zeros(tree.rows.shape[0], np.int32),)),
        "decode": ("sample", decode, sample_extra(decode)),
    }


def measure(cfg: ModelConfig, spec: str, dtype: str) -> dict:
    """One mesh spec, optionally with rule overrides after a "/": ``model=8/experts=model`` (expert parallel)."""
    label = spec
    spec, *overrides = spec.split("/")
    rules = {**DEFAULT_RULES, **dict(o.split("=", 1) for o in overrides)}
    size = 1
    for v in parse_mesh_spec(spec).values():
        size *= v
    placement = Placement(make_mesh(spec, jax.devices()[:size]), rules)
    params = abstract_params(cfg, jnp.dtype(dtype))
    p_sh = placement.param_shardings(cfg, params)
    pool_sh = placement.pool_shardings(cfg, NUM_PAGES)
    pool_shape = jax.ShapeDtypeStruct((NUM_PAGES, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim), jnp.dtype(dtype))
    pool = jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(pool_shape.shape, pool_shape.dtype, sharding=s), pool_sh
    )
    params = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, p_sh)
    out = {"mesh": label, "devices": size, "sharding": placement.describe(cfg, params, NUM_PAGES), "steps": {}}
    out["sharding"].pop("params")
    for name, (kind, step, extra) in steps().items():
        body, n_in, n_out = _BODIES[kind]
        statics = dict(cfg=cfg, impl="reference", tree=step.tree, decode=step.decode, dtype=dtype)
        if kind == "sample":
            statics["greedy_only"] = True
        in_sh = (p_sh, pool_sh, placement.token_sharding(step.tokens.shape[0]), placement.meta_shardings(step.meta))
        in_sh += (placement.replicated,) * (n_in - 2)
        fn = jax.jit(
            functools.partial(body, **statics),
            in_shardings=in_sh,
            out_shardings=(placement.replicated,) * n_out + (pool_sh,),
            donate_argnums=(1,),
        )
        t0 = time.perf_counter()
        compiled = fn.lower(params, pool, step.tokens, step.meta, step.rows, *extra).compile()
        stats = collective_stats(compiled.as_text())
        out["steps"][name] = {
            "tokens": int(step.tokens.shape[0]),
            "compile_s": round(time.perf_counter() - t0, 2),
            "collectives": {k: v for k, v in stats.items() if v["count"] or k == "total"},
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m-instruct")
    parser.add_argument("--specs", default="model=8;data=2,model=4;model=2", help="';'-separated mesh specs")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", default=str(RESULTS_DIR / "collectives.json"))
    args = parser.parse_args(argv)
    results = {
        **run_header(),
        "devices": [str(d) for d in jax.devices()],
        "dtype": args.dtype,
        "bytes": "sum of each collective's result size (all-gather: gathered; reduce-scatter: one shard)",
        "models": {},
    }
    for name in args.models.split(","):
        cfg = model_config(name)
        results["models"][name] = {
            "config": {
                "heads": cfg.num_heads,
                "kv_heads": cfg.num_kv_heads,
                "hidden": cfg.hidden_size,
                "mlp": cfg.intermediate_size,
                "vocab": cfg.vocab_size,
                "layers": cfg.num_layers,
                "experts": cfg.num_experts,
                "experts_per_token": cfg.experts_per_token,
            },
            "meshes": [measure(cfg, spec, args.dtype) for spec in args.specs.split(";")],
        }
        for m in results["models"][name]["meshes"]:
            for step, r in m["steps"].items():
                t = r["collectives"]["total"]
                print(
                    f"{name:24s} {m['mesh']:16s} {step:11s} {t['count']:4d} collectives {t['bytes'] / 1e6:9.3f} MB",
                    flush=True,
                )
    print(write_results(args.out, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
