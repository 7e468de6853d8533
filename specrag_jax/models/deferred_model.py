"""A model loaded on first use: ``DeferredTextModel`` stands in for a ``TextModel`` whose weights may never be needed.

Its name, tokenizer and config are there at once (the config from the weights file's header, no weights read), so
prompts can be tokenised and the work a model would do costed (``cost``) before deciding to run it. Anything else
(``runner``, ``generator``, ``generate_ids``, ...) loads the model once, under a lock, and delegates to it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from specrag_jax.models.config import ModelConfig
from specrag_jax.models.executor.cost import ModelCost
from specrag_jax.models.loading.load import source_config
from specrag_jax.models.text_model import TextModel
from specrag_jax.models.tokenizer.load import load_tokenizer


class DeferredTextModel:
    """``load()`` runs on the first access to anything but ``name``, ``tokenizer``, ``cfg``, ``loaded``,
    ``load_s`` and ``cost``."""

    def __init__(self, name: str, load: Callable[[], TextModel]) -> None:
        self.name = name
        self.tokenizer = load_tokenizer(name)
        self.cfg: ModelConfig = source_config(name)
        self._load = load
        self._model: TextModel | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def load_s(self) -> float:
        """The load's seconds once loaded (0.0 before: nothing was loaded)."""
        return self._model.load_s if self._model is not None else 0.0

    def get(self) -> TextModel:
        """The model, loaded now if it was not yet (once, whichever thread asks first)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def cost(self, itemsize: int = 4) -> ModelCost:
        """The per-token costs of its float32 weights, from the config alone (the loaded model's are exact)."""
        cfg = self.cfg
        shape = ModelCost.of(cfg, 0.0)
        embed = float(cfg.vocab_size * cfg.hidden_size)
        weights = shape.body_params + embed * (1 if cfg.tie_embeddings else 2)
        return ModelCost.of(cfg, weights * itemsize, kv_itemsize=itemsize)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in ("_model", "_load", "_lock"):
            raise AttributeError(attr)
        return getattr(self.get(), attr)


def ensure_loaded(model: Any) -> float:
    """Load ``model`` now if it is a ``DeferredTextModel`` not loaded yet; the seconds that took (else 0.0)."""
    if isinstance(model, DeferredTextModel) and not model.loaded:
        return model.get().load_s
    return 0.0
