"""Engine-backed models for the pipeline: a ``TextModel`` whose generator submits to a shared, started engine.

``EngineTextModel`` runs the unchanged pipeline (drafting, verification, the baselines) one request per worker
thread while the engines batch the work of all requests; its ``RequestContext`` carries one HTTP request's
deadline and cancellation to every engine call it makes.
"""

from __future__ import annotations

from specrag_jax.models.engine.context import RequestContext
from specrag_jax.models.engine.engine import Engine
from specrag_jax.models.generation import Generator
from specrag_jax.models.text_model import TextModel


class EngineTextModel(TextModel):
    """A loaded model whose generation and scoring go through a shared engine, for one request context."""

    def __init__(self, base: TextModel, engine: Engine, ctx: RequestContext, role: str = "") -> None:
        generator = Generator.over(engine, ctx, role or engine.name)
        super().__init__(base.name, base.runner, base.tokenizer, base.load_s, base.instruct, generator)


__all__ = ["EngineTextModel"]
