"""One engine per model: the roles (drafter, verifier) that share a model share its engine."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from specrag_jax.models.engine.engine import Engine


def engine_per_model(models: Mapping[str, Any], make: Callable[[str, Any], Engine]) -> dict[str, Engine]:
    """``{role: engine}`` for ``{role: model}``: ``make(role, model)`` builds the engine of each distinct model
    (by its ``runner``) for the first role that uses it; later roles on the same model get that engine."""
    by_runner: dict[int, Engine] = {}
    engines: dict[str, Engine] = {}
    for role, model in models.items():
        eng = by_runner.get(id(model.runner))
        if eng is None:
            eng = by_runner[id(model.runner)] = make(role, model)
        engines[role] = eng
    return engines


def distinct_engines(engines: Mapping[str, Engine]) -> dict[str, Engine]:
    """Each engine once, by its name (a shared engine is named after its first role)."""
    return {eng.name: eng for eng in engines.values()}
