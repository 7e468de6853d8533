"""Lazily re-exported public names for a package's ``__init__`` (PEP 562).

A package lists its public names by submodule; a name's submodule is imported when the name is first read, so
importing a package (or any one of its modules, which imports the package first) costs nothing more:
``specrag`` starts without importing JAX, and no ``__init__`` can close an import cycle.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package`` exporting ``exports`` (submodule, relative
    to the package -> the public names it defines)."""
    where = {name: f"{package}.{module}" for module, names in exports.items() for name in names}

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    def dir_() -> list[str]:
        return sorted(where)

    return sorted(where), getattr_, dir_
