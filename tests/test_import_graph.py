"""The package's import graph, read with ``ast`` (every import, function-level and ``TYPE_CHECKING`` ones included).

Layers point one way (DESIGN.md section 2): ``kernels <- models <- parallel``, ``models <- pipeline <- serving``,
``pipeline <- evaluation <- drafter_data``; ``parallel`` sits above ``models`` because its axis rules and placements
know ``ModelConfig`` and the parameter tree, and ``models`` reaches a placement only through
``models.executor.placement_api.StepPlacement``. ``pipeline`` (the method) never imports ``evaluation`` or
``drafter_data``; ``training`` sits under ``pipeline`` (the factory merges trained adapters) and imports neither.
No module of any package imports itself back through others.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "specrag_jax"
PACKAGE = ROOT.name


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, is_package: bool = False, modules: frozenset[str] = frozenset()) -> set[str]:
    """Every specrag_jax module ``source`` (the text of ``module``) imports, at any depth of the file.

    ``from pkg import name`` imports the submodule ``pkg.name`` when that is one of ``modules``, else ``pkg``
    itself (a name its ``__init__`` defines)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: drop (level - 1) trailing parts of the package
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            subs = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(base)
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def module_graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = frozenset(map(_module_name, paths))
    return {
        _module_name(p): imports_in(p.read_text(encoding="utf-8"), _module_name(p), p.name == "__init__.py", modules)
        for p in paths
    }


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph() -> dict[str, set[str]]:
    """Top-level subpackage (or module) -> the others it imports."""
    out: dict[str, set[str]] = defaultdict(set)
    for module, targets in module_graph().items():
        out[_top(module)].update(t for t in map(_top, targets) if t not in (_top(module), PACKAGE))
    return dict(out)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_packages_form_no_cycle():
    cycle = find_cycle(package_graph())
    assert cycle is None, " -> ".join(cycle)


PACKAGES = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())


def test_every_package_is_checked():
    assert {"kernels", "models", "parallel", "pipeline", "retrieval", "serving", "training"} <= set(PACKAGES)
    assert {"evaluation", "drafter_data"} <= set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_form_no_cycle(package):
    graph = {m: {t for t in ts if _top(t) == package} for m, ts in module_graph().items() if _top(m) == package}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_modules_form_no_cycle_across_packages():
    cycle = find_cycle(module_graph())
    assert cycle is None, " -> ".join(cycle)


FORBIDDEN = {
    "kernels": {"models", "parallel", "pipeline", "serving", "retrieval", "rerank", "training"},
    "models": {"parallel", "pipeline", "serving", "retrieval", "rerank", "training", "cli"},
    "pipeline": {"evaluation", "drafter_data", "serving", "cli"},
    "evaluation": {"drafter_data", "serving", "cli"},
    "drafter_data": {"serving", "cli"},
    "training": {"pipeline", "evaluation", "drafter_data", "serving", "cli"},
    "serving": {"evaluation", "drafter_data", "cli"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(package):
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in module_graph().items()
        if _top(module) == package
        for target in targets
        if _top(target) in FORBIDDEN[package]
    )
    assert not offenders, "; ".join(offenders)


def test_imports_in_sees_function_level_and_relative_imports():
    source = (
        "import os\nfrom . import sampling\nfrom ..kernels import metadata\n"
        "def f():\n    from specrag_jax.parallel.placement import put_global\n"
    )
    assert imports_in(source, "specrag_jax.models.x") == {
        "specrag_jax.models",
        "specrag_jax.kernels",
        "specrag_jax.parallel.placement",
    }


def test_imports_in_resolves_submodules_imported_from_their_package():
    source = "from specrag_jax.models import sampling, NAME\nfrom . import layers\n"
    modules = frozenset({"specrag_jax.models.sampling", "specrag_jax.models.decoder.layers"})
    assert imports_in(source, "specrag_jax.models.decoder.x", modules=modules) == {
        "specrag_jax.models.sampling",
        "specrag_jax.models",
        "specrag_jax.models.decoder.layers",
    }
    assert imports_in("from specrag_jax.models import sampling\n", "specrag_jax.models.x", modules=modules) == {
        "specrag_jax.models.sampling"
    }
