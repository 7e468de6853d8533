"""Sharded Mixtral (sparse MoE) == single device, and the collectives its steps compile to.

``XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m specrag_jax.parallel.checks_moe`` prints one JSON
object (the tests run it in a subprocess): per layout (tensor parallel inside experts, expert parallel, with a
data axis), greedy tokens equal?, the largest tree-score difference, the parameter specs, and per step (prefill
through the grouped experts, tree score, decode through the gathered experts) the collectives.
"""

from __future__ import annotations

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
from specrag_jax.models.sampling.batch import SamplingBatch
from specrag_jax.parallel.checks import TREE, compare
from specrag_jax.parallel.hlo import collective_stats
from specrag_jax.parallel.mesh import parse_mesh_spec
from specrag_jax.parallel.placement import Placement

LAYOUTS = {
    "tp_in_experts": ("model=8", {}),
    "expert_parallel": ("model=8", {"experts": "model"}),
    "tp_data": ("data=2,model=4", {}),
}


def tiny_moe() -> ModelConfig:
    """Tiny Mixtral whose heads, KV heads, vocabulary, experts (8) and expert width (32) split over 8 devices."""
    return tiny_config(
        "mixtral",
        vocab_size=128,
        num_heads=8,
        num_kv_heads=4,
        head_dim=16,
        intermediate_size=32,
        num_experts=8,
        experts_per_token=2,
    )


def step_collectives(cfg: ModelConfig, params, spec: str, rules: dict) -> dict:
    """Collectives of the compiled prefill (16 tokens), tree score and decode (2 sequences) steps."""
    n = math.prod(parse_mesh_spec(spec).values())
    runner = ModelRunner(
        cfg,
        params,
        num_pages=8,
        page_size=16,
        max_seq_len=64,
        placement=Placement.from_spec(spec, jax.devices()[:n], **rules),
    )
    prefill = runner.pack([Chunk([1, 2], 0, list(range(3, 19)), rows=[15])])
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

    def extra(step):
        return SamplingBatch.greedy(step.rows.shape[0]), runner.penalties.state

    lowered = {
        "prefill": runner.lower_step("sample", prefill, *extra(prefill)),
        "tree_score": runner.lower_step("score", tree, np.zeros(tree.rows.shape[0], np.int32)),
        "decode": runner.lower_step("sample", decode, *extra(decode)),
    }
    out = {}
    for name, low in lowered.items():
        stats = collective_stats(low.compile().as_text())
        tokens = {"prefill": prefill, "tree_score": tree, "decode": decode}[name].tokens.shape[0]
        out[name] = {
            "tokens": int(tokens),
            "moe_impl": cfg.moe_impl_for(int(tokens)),
            "collectives": {k: v for k, v in stats.items() if v["count"] or k == "total"},
        }
    return out


def check_moe(layouts=tuple(LAYOUTS)) -> dict:
    cfg = tiny_moe()
    params = init_params(cfg, seed=3)
    out: dict = {"layers": cfg.num_layers, "experts": cfg.num_experts}
    for name in layouts:
        spec, rules = LAYOUTS[name]
        t0 = time.perf_counter()
        r = compare(cfg, params, spec, **rules)
        placement = Placement.from_spec(spec, jax.devices()[: math.prod(parse_mesh_spec(spec).values())], **rules)
        described = placement.describe(cfg, params, 24)["params"]
        r["specs"] = {k.split("/", 2)[-1]: v for k, v in described.items() if "/mlp/" in k}
        r["steps"] = step_collectives(cfg, params, spec, rules)
        r["s"] = round(time.perf_counter() - t0, 2)
        out[name] = r
    return out


def main(argv=None) -> int:
    layouts = (argv if argv is not None else sys.argv[1:]) or list(LAYOUTS)
    print(json.dumps({"devices": len(jax.devices()), **check_moe(tuple(layouts))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
