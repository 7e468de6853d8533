"""Training runs on a tiny model: learning, compile count, checkpoints, exact resume, refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specrag_jax.errors import SpecRagError
from specrag_jax.models.decoder.transformer import init_params, unstack_layers
from specrag_jax.training import loop
from specrag_jax.training.batching import BatchPlan, make_batch, pack_rows
from specrag_jax.training.checkpoint import TrainCheckpoints
from specrag_jax.training.lora import LoraConfig
from specrag_jax.training.objective import row_logits
from specrag_jax.training.step import OptimConfig
from tests.training.conftest import BATCH_KEYS, counting_examples, small_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, HELD = counting_examples(160, seed=0), counting_examples(20, seed=1)


def test_a_few_hundred_steps_lower_the_held_out_loss(tiny, tmp_path):
    cfg, params = tiny
    config = small_config(
        lora=LoraConfig(8, 16.0), batch=8, optim=dict(lr=2e-2, warmup=20, steps=300), eval_every=100, save_every=300
    )
    result = loop.train(cfg, params, TRAIN, HELD, config, tmp_path, base_name="tiny")
    steps, evals = zip(*result.history.eval)
    assert steps == (0, 100, 200, 300)  # the base model first, then every --eval-every steps
    assert evals[-1] < evals[0] - 1.5 and max(evals[1:]) < evals[0] - 1.0, evals
    assert result.tokens_per_s > 0 and result.end_step == 300
    assert (tmp_path / "loss.png").stat().st_size > 1000 and (tmp_path / "history.json").exists()
    # only the adapters train: rank 8 x (in + out) of the 7 projections, 2 layers
    per_layer = (32 + 64) + (32 + 32) * 2 + (64 + 32) + (32 + 64) * 2 + (64 + 32)
    assert result.trainable_params == 2 * 8 * per_layer


def test_a_run_compiles_one_program_per_bucket_and_step_kind(tiny, tmp_path):
    cfg, params = tiny
    loop._STEP_CACHE.clear()
    mixed = counting_examples(60, seed=3, max_prompt=120)  # lengths spread over buckets 64 and 128
    config = small_config(max_len=128, buckets=(64,), optim=dict(steps=30), eval_every=15, save_every=30)
    result = loop.train(cfg, params, mixed, HELD, config, tmp_path, base_name="tiny")
    [fns] = loop._STEP_CACHE.values()
    lengths = {b.shape for b in BatchPlan(4, (64, 128), 8).batches(mixed, seed=0)}
    assert len(lengths) == 2  # the data spans both buckets
    assert fns.train._cache_size() == 2  # one train program per bucket length, none for a fresh state
    assert fns.eval._cache_size() == 1  # the held-out split fits bucket 64
    assert result.programs == 3


def test_resume_continues_exactly_and_restores_bitwise(tiny, tmp_path):
    cfg, params = tiny
    config = small_config(optim=dict(steps=12), save_every=4, eval_every=4, keep_checkpoints=3)
    whole = loop.train(cfg, params, TRAIN, HELD, config, tmp_path / "a", base_name="tiny", keep_state=True)
    part = loop.train(cfg, params, TRAIN, HELD, config, tmp_path / "b", base_name="tiny", stop_after=6, keep_state=True)
    assert part.end_step == 6 and TrainCheckpoints(tmp_path / "b" / "checkpoints").latest_step() == 4

    # the checkpoint of step 4 holds exactly what the uninterrupted run had at step 4: same logits, bitwise
    saved = TrainCheckpoints(tmp_path / "a" / "checkpoints")
    trainable_4, meta = saved.restore_trainable(4)
    again, _ = TrainCheckpoints(tmp_path / "b" / "checkpoints").restore_trainable(4)
    jax.tree_util.tree_map(np.testing.assert_array_equal, trainable_4, again)
    assert meta["data_position"] == {"epoch": 0, "index": 4} and meta["base_model"] == "tiny"
    final, _ = saved.restore_trainable()
    rows = pack_rows(HELD, 64, 8)
    batch = {k: jnp.asarray(getattr(make_batch(rows, len(rows), 64), k)) for k in BATCH_KEYS}
    frozen = unstack_layers(params, cfg.num_layers)
    logits = jax.jit(lambda t: row_logits(t, frozen, cfg, batch, mode="lora", lora_scale=2.0, max_segments=8))
    assert np.array_equal(np.asarray(logits(final)), np.asarray(logits(whole.state.trainable)))

    resumed = loop.train(cfg, params, TRAIN, HELD, config, tmp_path / "b", base_name="tiny", resume=True)
    assert resumed.start_step == 4 and resumed.end_step == 12
    assert resumed.history.train == whole.history.train  # every step's loss and lr, bit for bit
    assert resumed.history.eval == whole.history.eval


def test_refusals_on_resume(tiny, tmp_path):
    cfg, params = tiny
    config = small_config(optim=dict(steps=4, warmup=2), save_every=4)
    loop.train(cfg, params, TRAIN, HELD, config, tmp_path, base_name="tiny")
    with pytest.raises(SpecRagError, match="already holds a training checkpoint .step 4.; pass --resume"):
        loop.train(cfg, params, TRAIN, HELD, config, tmp_path, base_name="tiny")
    other = init_params(cfg, seed=2)
    with pytest.raises(
        SpecRagError,
        match=r"trained on base model 'tiny' \(fingerprint \w+\), not on 'other' "
        r"\(fingerprint \w+\)",
    ):
        loop.train(cfg, other, TRAIN, HELD, config, tmp_path, base_name="other", resume=True)
    changed = small_config(optim=dict(steps=4, warmup=2, lr=5e-3), save_every=4)
    with pytest.raises(SpecRagError, match=r"differing: optim.lr: now 0.005, checkpoint 0.01"):
        loop.train(cfg, params, TRAIN, HELD, changed, tmp_path, base_name="tiny", resume=True)
    with pytest.raises(SpecRagError, match="different file or content"):
        loop.train(cfg, params, TRAIN, HELD, config, tmp_path, base_name="tiny", resume=True, data_id="x")


def test_full_fine_tuning_trains_every_parameter(tiny, tmp_path):
    cfg, params = tiny
    config = small_config(mode="full", optim=dict(steps=6, lr=1e-3), save_every=6, eval_every=6)
    result = loop.train(cfg, params, TRAIN, HELD, config, tmp_path, base_name="tiny", keep_state=True)
    n = sum(x.size for x in jax.tree_util.tree_leaves(params))
    assert result.trainable_params == n and result.frozen == {}
    restored, meta = TrainCheckpoints(tmp_path / "checkpoints").restore_trainable()
    assert meta["mode"] == "full" and meta["lora"] is None
    moved = jax.tree_util.tree_map(
        lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
        restored,
        unstack_layers(params, cfg.num_layers),
    )
    assert min(jax.tree_util.tree_leaves(moved)) > 0  # norms, embeddings and projections all updated


def test_interrupted_save_leaves_the_previous_checkpoint_whole(tmp_path):
    """A process killed (SIGKILL) in the middle of saving step 2: step 1 is still the newest, intact."""
    script = textwrap.dedent(f"""
        import os, signal
        import numpy as np
        import orbax.checkpoint._src.path.atomicity as atomicity
        from specrag_jax.training.checkpoint import TrainCheckpoints
        c = TrainCheckpoints({str(tmp_path)!r})
        c.save(1, {{"a": np.arange(5.0)}}, {{"m": np.ones(3)}}, {{"note": "one"}})
        async def killed(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)  # every file of step 2 written, not yet committed
        atomicity.AtomicRenameTemporaryPath.finalize = killed
        c.save(2, {{"a": np.arange(5.0) * 2}}, {{"m": np.zeros(3)}}, {{"note": "two"}})
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert any("tmp" in p for p in os.listdir(tmp_path))  # the half-written step is there ...
    ckpts = TrainCheckpoints(tmp_path)
    assert ckpts.latest_step() == 1 and ckpts.all_steps() == [1]  # ... and never picked up
    trainable, meta = ckpts.restore_trainable()
    np.testing.assert_array_equal(trainable["a"], np.arange(5.0))
    assert meta["note"] == "one"
    ckpts.save(2, {"a": np.arange(5.0) * 3}, {"m": np.zeros(3)}, {"note": "again"})  # the step can be redone
    assert TrainCheckpoints(tmp_path).restore_trainable()[1]["note"] == "again"


def test_optim_config_checks():
    with pytest.raises(SpecRagError, match="--warmup must be in"):
        OptimConfig(warmup=30, steps=10)
    with pytest.raises(SpecRagError, match="--lr must be > 0"):
        OptimConfig(lr=0.0)
