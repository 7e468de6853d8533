"""Sharded-vs-single-device checks, runnable on any device set: ``python -m specrag_jax.parallel.checks``.

On a CPU host run with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the tests do, in a
subprocess). Prints one JSON object: per check, the measured differences (the tests assert on them).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time

import jax
import numpy as np

from specrag_jax.models.config import ModelConfig, tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.models.executor.packing import Chunk
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.generation import greedy_generate
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.parallel.mesh import parse_mesh_spec
from specrag_jax.parallel.placement import Placement

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [3, 4, 5]]
TREE = dict(tokens=[30, 31, 32, 40, 41, 50], parents=[-1, 0, 1, -1, 3, -1], positions=[0, 1, 2, 0, 1, 0])


def tiny(arch: str) -> ModelConfig:
    """A tiny config whose heads, KV heads (llama) and vocabulary split over 4-8 devices."""
    kv = 4 if arch == "llama" else 1  # Gemma 3 keeps one KV head: its K/V stay replicated
    return tiny_config(arch, vocab_size=128, num_heads=8, num_kv_heads=kv, head_dim=16)


def run_model(runner: ModelRunner, prompts, max_new: int, prefix: list[int]) -> tuple[list, np.ndarray]:
    """Greedy tokens of ``prompts`` and verification-style tree scores over a cached ``prefix``."""
    ids = greedy_generate(runner, prompts, max_new)
    pages = runner.allocator.allocate(-(-(len(prefix) + 8) // runner.page_size))
    runner.score(runner.pack([Chunk(pages, 0, prefix, rows=[0])]), [1])
    n = len(prefix)
    tree = Chunk(
        pages,
        n,
        TREE["tokens"],
        parents=TREE["parents"],
        positions=[n + p for p in TREE["positions"]],
        write=False,
        rows=list(range(len(TREE["tokens"]))),
    )
    scores = runner.score(runner.pack([tree]), TREE["tokens"][1:] + [3])
    runner.allocator.release(pages)
    return ids, scores


def compare(
    cfg: ModelConfig,
    params,
    spec: str,
    *,
    impl: str = "reference",
    prompts=PROMPTS,
    max_new: int = 6,
    prefix=None,
    devices=None,
    page_size: int = 16,
    max_seq_len: int = 128,
    **rules,
) -> dict:
    """Single-device runner vs a runner sharded on ``spec``: tokens equal? largest score difference."""
    prefix = prefix or list(range(3, 23))
    kw = dict(num_pages=24, page_size=page_size, max_seq_len=max_seq_len, attention_impl=impl)
    t0 = time.perf_counter()
    ref_ids, ref_scores = run_model(ModelRunner(cfg, params, **kw), prompts, max_new, prefix)
    t1 = time.perf_counter()
    placement = Placement.from_spec(spec, devices, **rules)
    runner = ModelRunner(cfg, params, placement=placement, **kw)
    ids, scores = run_model(runner, prompts, max_new, prefix)
    leaf = jax.tree_util.tree_leaves(runner.params)[0]
    return {
        "spec": spec,
        "impl": impl,
        "arch": cfg.arch,
        "tokens_equal": ids == ref_ids,
        "tokens": ids,
        "max_score_diff": float(np.max(np.abs(scores - ref_scores))),
        "num_devices": len(leaf.sharding.device_set),
        "pool_sharding": str(runner.pool.k[0].sharding.spec),
        "replicated": placement.describe(cfg, runner.params, 24)["replicated"],
        "single_s": round(t1 - t0, 2),
        "sharded_s": round(time.perf_counter() - t1, 2),
    }


def check_tiny(specs=("data=2,model=4", "model=8")) -> list[dict]:
    out = []
    for arch, spec in zip(("llama", "gemma3"), specs):
        cfg = tiny(arch)
        # Llama also splits the pool's pages over "data" (KV capacity grows with the data axis).
        rules = {"pages": "data"} if arch == "llama" and "data" in spec else {}
        out.append(compare(cfg, init_params(cfg, seed=3), spec, **rules))
    return out


def check_gemma(spec: str = "data=2,model=4", name: str = "gemma3-270m", max_new: int = 4) -> dict:
    """The real Gemma 3 270M: greedy tokens and tree scores, sharded vs single device."""
    from specrag_jax.models.loading.load import load_model_params
    from specrag_jax.models.tokenizer.load import load_tokenizer

    cfg, params = load_model_params(name, dtype="float32")
    tok = load_tokenizer(name)
    prompts = [tok.encode("The capital of France is", add_bos=True)]
    prefix = tok.encode("Question: which river flows through Paris? Answer:", add_bos=True)
    return compare(cfg, params, spec, prompts=prompts, max_new=max_new, prefix=prefix, max_seq_len=96)


def check_pallas_model(spec: str = "model=4") -> dict:
    """The whole tiny Llama with ``attention_impl="pallas"`` (interpret mode on CPU), sharded vs single device."""
    from specrag_jax.models.decoder.transformer import Decoder

    cfg = tiny("llama").replace(head_dim=64)
    n = math.prod(parse_mesh_spec(spec).values())
    params = init_params(cfg, seed=3)
    out = compare(cfg, params, spec, impl="pallas", devices=jax.devices()[:n], max_new=3)
    # With the model's attention_mesh hook, every layer's kernel runs inside shard_map (a manual computation).
    out["hook"] = "attention_mesh" in getattr(Decoder, "__dataclass_fields__", {})
    runner = ModelRunner(
        cfg,
        params,
        num_pages=8,
        page_size=16,
        max_seq_len=64,
        attention_impl="pallas",
        placement=Placement.from_spec(spec, jax.devices()[:n]),
    )
    text = runner.lower_step("logits", runner.pack([Chunk([1, 2], 0, list(range(3, 23)), rows=[0])])).as_text()
    out["shard_map_layers"] = text.count("manual_computation")
    return out


def check_pallas(spec: str = "model=4") -> list[dict]:
    """``sharded_paged_attention`` (Pallas, interpret mode on CPU) vs the unsharded kernel: tree + decode."""
    import jax.numpy as jnp

    from specrag_jax.kernels import paged_attention
    from specrag_jax.kernels.sharded import head_split, sharded_paged_attention
    from specrag_jax.models.executor.packing import pack_chunks

    mesh = Placement.from_spec(spec, jax.devices()[:4]).mesh
    rng = np.random.default_rng(0)
    out = []
    for hq, hkv in ((8, 4), (8, 1)):
        d, ps, n_pages = 32, 16, 8
        kp, vp = (jnp.asarray(rng.normal(size=(n_pages, ps, hkv, d)), jnp.float32) for _ in range(2))
        for decode in (False, True):
            if decode:
                chunks = [Chunk([1, 2], 20, [7], rows=[0]), Chunk([3], 5, [8], rows=[0])]
            else:
                chunks = [
                    Chunk(
                        [1, 2],
                        20,
                        TREE["tokens"],
                        parents=TREE["parents"],
                        positions=[20 + p for p in TREE["positions"]],
                        write=False,
                        rows=[0],
                    )
                ]
            step = pack_chunks(
                chunks, page_size=ps, num_slots=n_pages * ps, min_token_bucket=8, min_page_bucket=2, max_page_bucket=4
            )
            t = step.tokens.shape[0]
            q = jnp.asarray(rng.normal(size=(t, hq, d)), jnp.float32)
            kn, vn = (jnp.asarray(rng.normal(size=(t, hkv, d)), jnp.float32) for _ in range(2))
            kw = dict(scale=d**-0.5, tree=not decode, decode=decode, impl="pallas")
            meta = jax.tree_util.tree_map(jnp.asarray, step.meta)
            ref = paged_attention(q, kn, vn, kp, vp, meta, **kw)
            got = jax.jit(functools.partial(sharded_paged_attention, mesh=mesh, **kw))(q, kn, vn, kp, vp, meta)
            out.append(
                {
                    "heads": [hq, hkv],
                    "split": head_split(hq, hkv, 4),
                    "decode": decode,
                    "max_diff": float(jnp.max(jnp.abs(got - ref))),
                    "out_sharding": str(got.sharding.spec),
                }
            )
    return out


def check_dense(spec: str = "data=2,model=4", num_docs: int = 1003, dim: int = 24) -> dict:
    """Sharded top-k (rows over all devices, 1003 rows: uneven shards) equals ``DenseIndex.search_vector``."""
    from specrag_jax.parallel.dense import ShardedDenseIndex
    from specrag_jax.retrieval.dense import DenseIndex

    rng = np.random.default_rng(1)
    emb = rng.normal(size=(num_docs, dim)).astype(np.float32)
    emb[7] = emb[500]  # an exact tie across shards: the lower index must come first
    docs = [{"id": str(i), "title": "", "text": f"doc {i}"} for i in range(num_docs)]
    index = DenseIndex(docs, emb, model="random", mean=emb.mean(0))
    sharded = ShardedDenseIndex(index, Placement.from_spec(spec))
    queries = np.concatenate([rng.normal(size=(5, dim)), emb[500][None]]).astype(np.float32)
    same, max_diff = True, 0.0
    for n in (1, 10, 130):
        got = sharded.search_vectors(queries, n)
        for q, g in zip(queries, got):
            want = index.search_vector(q, n)
            same &= [i for i, _ in g] == [i for i, _ in want]
            max_diff = max(max_diff, max(abs(a[1] - b[1]) for a, b in zip(g, want)))
    return {
        "spec": spec,
        "shards": sharded.num_shards,
        "ids_equal": bool(same),
        "max_score_diff": max_diff,
        "tie_order": [i for i, _ in sharded.search_vector(emb[500], 2)],
    }


def check_submeshes(drafter_devices: int = 2, verifier_devices: int = 6) -> dict:
    """Drafter (2 devices) and verifier (6) on disjoint meshes, dispatched from two threads at once."""
    from specrag_jax.parallel.submesh import drafter_verifier_placements, overlap_s, run_concurrently

    pl = drafter_verifier_placements(drafter_devices, verifier_devices, verifier_spec="data=3,model=2")
    d_cfg, v_cfg = tiny("llama"), tiny("gemma3")
    kw = dict(num_pages=24, page_size=16, max_seq_len=128)
    drafter = ModelRunner(d_cfg, init_params(d_cfg, seed=4), placement=pl.drafter, **kw)
    verifier = ModelRunner(v_cfg, init_params(v_cfg, seed=5), placement=pl.verifier, **kw)
    draft_fn = lambda: greedy_generate(drafter, PROMPTS, 8)  # noqa: E731
    verify_fn = lambda: run_model(verifier, PROMPTS, 4, list(range(3, 23)))[1]  # noqa: E731
    seq_d, seq_v = draft_fn(), verify_fn()  # also compiles both
    t0 = time.perf_counter()
    d, v = run_concurrently(draft_fn, verify_fn)
    wall = time.perf_counter() - t0
    return {
        "drafter_devices": sorted(x.id for x in pl.drafter.devices),
        "verifier_devices": sorted(x.id for x in pl.verifier.devices),
        "disjoint": pl.disjoint(),
        "drafter_params_on": sorted(x.id for x in jax.tree_util.tree_leaves(drafter.params)[0].sharding.device_set),
        "verifier_pool_on": sorted(x.id for x in verifier.pool.k[0].sharding.device_set),
        "same_as_sequential": d.value == seq_d and bool(np.allclose(v.value, seq_v, atol=1e-5)),
        "drafter_s": round(d.end - d.start, 3),
        "verifier_s": round(v.end - v.start, 3),
        "overlap_s": round(overlap_s(d, v), 3),
        "wall_s": round(wall, 3),
    }


def check_collectives(spec: str = "model=4") -> dict:
    """Collectives of the tiny Llama's compiled sharded steps (a regression guard; see benchmarks/collectives.py)."""
    import numpy as np

    from specrag_jax.parallel.hlo import collective_stats

    cfg = tiny("llama")
    n = math.prod(parse_mesh_spec(spec).values())
    runner = ModelRunner(
        cfg,
        init_params(cfg, seed=3),
        num_pages=8,
        page_size=16,
        max_seq_len=64,
        placement=Placement.from_spec(spec, jax.devices()[:n]),
    )
    tree = runner.pack(
        [
            Chunk(
                [1, 2],
                20,
                TREE["tokens"],
                parents=TREE["parents"],
                positions=[20 + p for p in TREE["positions"]],
                write=False,
                rows=list(range(6)),
            )
        ]
    )
    decode = runner.pack([Chunk([1, 2], 20, [7], rows=[0]), Chunk([3], 5, [8], rows=[0])])
    extra = (SamplingBatch.greedy(decode.rows.shape[0]), runner.penalties.state)
    steps = {
        "tree_score": runner.lower_step("score", tree, np.zeros(tree.rows.shape[0], np.int32)),
        "decode": runner.lower_step("sample", decode, *extra),
    }
    out = {name: collective_stats(low.compile().as_text()) for name, low in steps.items()}
    out["layers"] = cfg.num_layers
    out["table_bytes"] = cfg.vocab_size * cfg.hidden_size * 4
    return out


CHECKS = {
    "tiny": check_tiny,
    "gemma": check_gemma,
    "pallas": check_pallas,
    "pallas_model": check_pallas_model,
    "dense": check_dense,
    "submeshes": check_submeshes,
    "collectives": check_collectives,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checks", nargs="*", default=["tiny", "pallas", "dense", "submeshes"], help=f"any of {', '.join(CHECKS)}"
    )
    parser.add_argument(
        "--spec",
        default=None,
        help="mesh spec for tiny/gemma/dense (default: each check's own, for 8 devices), e.g. model=1 on one GPU",
    )
    args = parser.parse_args(argv)
    out = {"devices": len(jax.devices()), "platform": jax.devices()[0].platform}
    for name in args.checks:
        t0 = time.perf_counter()
        if args.spec and name == "tiny":
            out[name] = check_tiny((args.spec, args.spec))
        elif args.spec and name in ("gemma", "dense"):
            out[name] = CHECKS[name](args.spec)
        else:
            out[name] = CHECKS[name]()
        out[f"{name}_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
