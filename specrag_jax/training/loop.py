"""The training run: batches -> jitted steps -> held-out evaluation, checkpoints, history and a loss plot.

``--resume`` restores the adapters (or parameters), the optimizer state, the step, the data position and the
loss history of the newest checkpoint, after checking the base model's fingerprint and the settings, so the
resumed run computes exactly the losses an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.decoder.transformer import unstack_layers
from specrag_jax.parallel.placement import Placement
from specrag_jax.training import sharding as sh
from specrag_jax.training.batching import Batch, BatchPlan, BatchStream, bucket_lengths
from specrag_jax.training.checkpoint import TrainCheckpoints, base_fingerprint, check_base
from specrag_jax.training.config import TrainConfig
from specrag_jax.training.data import Example
from specrag_jax.training.history import History, plot_losses, write_json_atomic
from specrag_jax.training.lora import count_params, init_lora
from specrag_jax.training.step import BATCH_FIELDS, TrainState, lr_schedule, make_optimizer, make_steps


@dataclasses.dataclass
class TrainResult:
    """What a run did (``tokens_per_s`` counts real tokens of steps that did not compile)."""

    history: History
    start_step: int
    end_step: int
    trainable_params: int
    programs: int
    tokens_per_s: float
    step_s: float
    seconds: float
    state: TrainState | None = None
    frozen: Any = None

    def summary(self) -> dict[str, Any]:
        last_eval = self.history.eval[-1][1] if self.history.eval else None
        return {
            "steps": [self.start_step, self.end_step],
            "trainable_params": self.trainable_params,
            "programs": self.programs,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "step_s": round(self.step_s, 4),
            "seconds": round(self.seconds, 2),
            "final_train_loss": self.history.train[-1][1] if self.history.train else None,
            "final_eval_loss": last_eval,
        }


def _device_batch(batch: Batch, sharding: Any) -> dict:
    arrays = {k: getattr(batch, k) for k in BATCH_FIELDS}
    if sharding is None:
        return jax.device_put(arrays, jax.devices()[0])
    return {k: jax.device_put(v, sharding) for k, v in arrays.items()}


def evaluate(fns, state: TrainState, frozen: Any, batches: Sequence[Batch], sharding: Any) -> float:
    """Held-out loss: summed target NLL over all batches / target tokens."""
    total, count = 0.0, 0.0
    for b in batches:
        t, c = fns.eval(state.trainable, frozen, _device_batch(b, sharding))
        total, count = total + float(t), count + float(c)
    return total / max(count, 1.0)


_STEP_CACHE: dict[Any, Any] = {}


def _steps(
    model_cfg: ModelConfig, config: TrainConfig, optimizer, state: TrainState | None, frozen: Any, batch_sh: Any
):
    """The jitted steps of a run, shared by runs of the same model, settings and layout in one process (a
    resumed or repeated run in a process reuses the compiled programs)."""
    shardings = None if state is None else (sh.state_shardings(state), sh.frozen_shardings(frozen))
    leaves, tree = jax.tree_util.tree_flatten(shardings)
    key = (
        model_cfg,
        config.mode,
        config.lora_scale,
        config.max_segments,
        config.dtype,
        config.optim,
        tree,
        tuple(leaves),
        batch_sh,
    )
    if key not in _STEP_CACHE:
        _STEP_CACHE[key] = make_steps(
            model_cfg,
            optimizer,
            mode=config.mode,
            lora_scale=config.lora_scale,
            max_segments=config.max_segments,
            dtype=config.dtype,
            state_shardings=None if shardings is None else shardings[0],
            frozen_shardings=None if shardings is None else shardings[1],
            batch_sharding=batch_sh,
            schedule=lr_schedule(config.optim),
        )
    return _STEP_CACHE[key]


def _trainable_and_frozen(cfg: ModelConfig, params: dict, config: TrainConfig) -> tuple[Any, Any]:
    if config.mode == "full":
        return params, None
    return init_lora(cfg, config.lora, jax.random.PRNGKey(config.seed)), params


def train(
    model_cfg: ModelConfig,
    base_params: dict,
    train_examples: Sequence[Example],
    eval_examples: Sequence[Example],
    config: TrainConfig,
    out_dir: str | Path,
    *,
    base_name: str,
    resume: bool = False,
    placement: Placement | None = None,
    progress: bool = False,
    stop_after: int | None = None,
    data_id: str = "",
    keep_state: bool = False,
) -> TrainResult:
    """Run (or resume) training into ``out_dir`` and return the history and throughput.

    ``stop_after``: stop after this many steps of this call (checkpoints as scheduled), as an interruption."""
    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fingerprint = base_fingerprint(model_cfg, base_params)
    ckpts = TrainCheckpoints(out / "checkpoints", max_to_keep=config.keep_checkpoints)
    latest = ckpts.latest_step()
    if latest is not None and not resume:
        raise SpecRagError(
            f"{out} already holds a training checkpoint (step {latest}); pass --resume to continue "
            f"it or choose a new --out"
        )
    params = unstack_layers(base_params, model_cfg.num_layers)
    trainable, frozen = _trainable_and_frozen(model_cfg, params, config)
    optimizer = make_optimizer(config.optim)
    state = sh.make_state(placement, model_cfg, trainable, config.mode, optimizer)
    frozen = sh.place_frozen(placement, model_cfg, frozen)
    history, position = History(), {"epoch": 0, "index": 0}
    if resume and latest is not None:
        meta = ckpts.read_meta(latest)
        check_base(meta, base_name, fingerprint)
        conflicts = config.resume_conflicts(meta.get("config", {}))
        if meta.get("data_id", data_id) != data_id:
            conflicts.append("training data: a different file or content than the checkpoint's")
        if conflicts:
            raise SpecRagError(f"--resume needs the checkpoint's settings; differing: {'; '.join(conflicts)}")
        restored, opt_state, meta = ckpts.restore(latest, state.trainable, state.opt_state)
        shardings = sh.state_shardings(state)
        state = sh.commit_like(TrainState(state.step, restored, opt_state), shardings)
        state = dataclasses.replace(state, step=jax.device_put(np.int32(meta["step"]), shardings.step))
        history, position = History.from_json(meta.get("history")), meta["data_position"]
    start = int(state.step)
    plan = BatchPlan(config.batch, bucket_lengths(config.max_len, config.buckets), config.max_segments)
    stream = BatchStream(plan, train_examples, config.seed, position["epoch"], position["index"])
    eval_batches = plan.batches(list(eval_examples), None) if eval_examples else []
    batch_sh = sh.batch_sharding(placement, config.batch)
    fns = _steps(model_cfg, config, optimizer, state if placement is not None else None, frozen, batch_sh)
    meta_base = {
        "base_model": base_name,
        "base_fingerprint": fingerprint,
        "mode": config.mode,
        "lora": config.lora.to_json() if config.mode == "lora" else None,
        "config": config.to_json(),
        "data_id": data_id,
        "model_config": dataclasses.asdict(model_cfg),
    }
    if eval_batches and start == 0 and not history.eval:  # the base model's held-out loss, for reference
        history.eval.append([0, evaluate(fns, state, frozen, eval_batches, batch_sh)])
    bar = _progress_bar(config.optim.steps, start, progress)
    seen_shapes: set[tuple[int, int]] = set()
    timed_tokens, timed_steps, timed_s = 0, 0, 0.0
    end = config.optim.steps if stop_after is None else min(config.optim.steps, start + stop_after)
    for step in range(start, end):
        batch = stream.next()
        t0 = time.perf_counter()
        state, metrics = fns.train(state, frozen, _device_batch(batch, batch_sh))
        loss = float(metrics["loss"])  # waits for the step
        if batch.shape in seen_shapes:
            timed_tokens, timed_s = timed_tokens + batch.num_tokens, timed_s + time.perf_counter() - t0
            timed_steps += 1
        seen_shapes.add(batch.shape)
        history.train.append([step + 1, loss, float(metrics["lr"])])
        done = step + 1
        if eval_batches and (done % config.eval_every == 0 or done == config.optim.steps):
            history.eval.append([done, evaluate(fns, state, frozen, eval_batches, batch_sh)])
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", **({"eval": f"{history.eval[-1][1]:.3f}"} if history.eval else {}))
        if done % config.save_interval == 0 or done == config.optim.steps:
            meta = {**meta_base, "data_position": stream.position, "history": history.to_json()}
            ckpts.save(done, state.trainable, state.opt_state, meta)
            _write_reports(out, history, base_name, config)
    bar.close()
    ckpts.close()
    _write_reports(out, history, base_name, config)
    return TrainResult(
        history,
        start,
        int(state.step),
        count_params(state.trainable),
        fns.compiled_programs(),
        timed_tokens / timed_s if timed_s else 0.0,
        timed_s / timed_steps if timed_steps else 0.0,
        time.perf_counter() - t_start,
        state if keep_state else None,
        frozen if keep_state else None,
    )


def _write_reports(out: Path, history: History, base_name: str, config: TrainConfig) -> None:
    write_json_atomic(out / "history.json", {**history.to_json(), "base_model": base_name, "mode": config.mode})
    plot_losses(history, out / "loss.png", f"{base_name} ({config.mode})")


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        disable=not enabled,
        file=sys.stderr,
        desc="train",
        unit="step",
        dynamic_ncols=True,
    )
