"""Loss history of a run: kept in checkpoints (so a resumed run continues it), written as JSON and a plot."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class History:
    """``train``: [step, loss, lr] per step; ``eval``: [step, held-out loss] per evaluation."""

    train: list[list[float]] = dataclasses.field(default_factory=list)
    eval: list[list[float]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"train": self.train, "eval": self.eval}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "History":
        data = data or {}
        return cls([list(r) for r in data.get("train", [])], [list(r) for r in data.get("eval", [])])

    def losses(self) -> list[float]:
        return [r[1] for r in self.train]


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON via a temporary file and a rename (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def plot_losses(history: History, path: Path, title: str = "") -> bool:
    """Train loss per step and held-out loss per evaluation as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    if history.train:
        ax.plot([r[0] for r in history.train], [r[1] for r in history.train], lw=0.8, label="train (batch)")
    if history.eval:
        ax.plot([r[0] for r in history.eval], [r[1] for r in history.eval], "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("target-token cross-entropy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return True
