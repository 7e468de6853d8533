"""Tiny random models and a learnable toy task for the training tests."""

from __future__ import annotations

import numpy as np
import pytest

from specrag_jax.models.config import tiny_config
from specrag_jax.models.decoder.transformer import init_params
from specrag_jax.training.data import Example
from specrag_jax.training.lora import LoraConfig
from specrag_jax.training.step import OptimConfig

BATCH_KEYS = ("tokens", "labels", "mask", "segments", "positions")


def counting_examples(n: int, seed: int = 0, max_prompt: int = 40) -> list[Example]:
    """Random prompts; targets count up from a random start (each target token is the previous + 1), EOS=2.

    Learnable from the current token alone, so a tiny model's held-out loss falls within a few hundred steps."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(3, 90, int(rng.integers(4, max_prompt))).astype(np.int32)
        start = int(rng.integers(3, 80))
        target = np.arange(start, min(start + int(rng.integers(3, 12)), 96), dtype=np.int32)
        out.append(Example(prompt, np.concatenate([target, [2]]).astype(np.int32)))
    return out


@pytest.fixture(scope="session")
def tiny():
    """(config, stacked params) of a 2-layer Llama-style model."""
    cfg = tiny_config("llama")
    return cfg, init_params(cfg, seed=1)


def small_config(**kw):
    from specrag_jax.training.config import TrainConfig

    optim = dict(lr=1e-2, warmup=5, steps=12)
    optim.update(kw.pop("optim", {}))
    base = dict(
        mode="lora",
        lora=LoraConfig(4, 8.0),
        optim=OptimConfig(**optim),
        batch=4,
        max_len=64,
        eval_every=4,
        save_every=4,
    )
    base.update(kw)
    return TrainConfig(**base)
