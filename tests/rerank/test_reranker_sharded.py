"""Stored K/V written into a pool sharded over KV heads (2 host devices, in a subprocess) scores as recompute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.xla_env import xla_flags

ROOT = Path(__file__).resolve().parents[2]
_CHILD = textwrap.dedent("""
    import json, sys, numpy as np
    from specrag_jax.models.config import tiny_config
    from specrag_jax.models.executor.runner import ModelRunner
    from specrag_jax.models.text_model import TextModel
    from specrag_jax.models.decoder.transformer import init_params
    from specrag_jax.parallel.placement import Placement
    from specrag_jax.rerank.kv_store import DocKVStore
    from specrag_jax.rerank.reranker import Reranker
    from specrag_jax.serving.tiny import CharTokenizer

    cfg = tiny_config("llama")
    runner = ModelRunner(cfg, init_params(cfg, seed=0), num_pages=64, page_size=16,
                         placement=Placement.from_spec("model=2"))
    m = TextModel("tiny:llama", runner, CharTokenizer())
    docs = [{"text": f"doc {i} " * (i + 3)} for i in range(4)]
    want = Reranker(m, mode="recompute").score("q?", docs)
    for _ in range(2):  # computed and stored, then loaded from the store
        with Reranker(m, store=DocKVStore(sys.argv[1], m)) as r:
            got = r.score("q?", docs)
    print(json.dumps({"diff": float(np.max(np.abs(np.array(got) - want))), "loaded": r.stats.loaded,
                      "spec": str(runner.pool.k[0].sharding.spec), "free": runner.allocator.num_free}))
""")


def test_sharded_pool(tmp_path):
    env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2"), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["diff"] < 1e-4 and out["loaded"] == 4 and out["free"] == 63
    assert "model" in out["spec"]  # the pool stayed sharded over KV heads
