"""TrainConfig: every setting of a run, serialised into its checkpoints (``--resume`` checks them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from specrag_jax.errors import SpecRagError
from specrag_jax.training.lora import LoraConfig
from specrag_jax.training.step import OptimConfig

MODES = ("lora", "full")
# Settings that only change when things are reported or saved: free to differ on --resume.
_FREE_ON_RESUME = ("eval_every", "save_every", "keep_checkpoints")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A run: LoRA or full fine-tuning, optimizer, batching (rows x bucketed length), evaluation, seed."""

    mode: str = "lora"
    lora: LoraConfig = LoraConfig()
    optim: OptimConfig = OptimConfig()
    batch: int = 8  # rows per step
    max_len: int = 1024
    buckets: tuple[int, ...] | None = None  # None: powers of two (batching.DEFAULT_BUCKETS) up to max_len
    max_segments: int = 8  # examples packed per row at most
    eval_every: int = 50
    save_every: int = 0  # 0: with every evaluation
    keep_checkpoints: int = 2  # newest steps kept on disk
    eval_fraction: float = 0.1
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecRagError(f"unknown training mode {self.mode!r}; choose lora or full")
        if self.batch < 1:
            raise SpecRagError(f"--batch must be >= 1 (got {self.batch})")
        if self.eval_every < 1:
            raise SpecRagError(f"--eval-every must be >= 1 (got {self.eval_every})")
        if self.dtype not in ("float32", "bfloat16"):
            raise SpecRagError(f"unsupported dtype {self.dtype!r}; use float32 or bfloat16")

    @property
    def save_interval(self) -> int:
        return self.save_every or self.eval_every

    @property
    def lora_scale(self) -> float:
        return self.lora.scale if self.mode == "lora" else 1.0

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["lora"] = self.lora.to_json() if self.mode == "lora" else None
        out["buckets"] = list(self.buckets) if self.buckets else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TrainConfig":
        data = dict(data)
        data["lora"] = LoraConfig.from_json(data["lora"]) if data.get("lora") else LoraConfig()
        data["optim"] = OptimConfig(**data["optim"])
        data["buckets"] = tuple(data["buckets"]) if data.get("buckets") else None
        return cls(**data)

    def resume_conflicts(self, saved: dict[str, Any]) -> list[str]:
        """Settings that differ from a checkpoint's (``name: now X, checkpoint Y``); resuming needs none."""
        now, out = self.to_json(), []
        for key in sorted(set(now) | set(saved)):
            if key in _FREE_ON_RESUME:
                continue
            a, b = now.get(key), saved.get(key)
            if isinstance(a, dict) and isinstance(b, dict):
                out += [
                    f"{key}.{k}: now {a.get(k)!r}, checkpoint {b.get(k)!r}"
                    for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k)
                ]
            elif a != b:
                out.append(f"{key}: now {a!r}, checkpoint {b!r}")
        return out
