"""serving's and the engine core's (``models/engine``) modules keep to each other's public names: no private
attribute of another object is read or written, no private name imported, and no import hidden (``TYPE_CHECKING``,
function level) to dodge a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "specrag_jax"
SERVING = PACKAGE / "serving"
CHECKED = sorted([*SERVING.glob("*.py"), *(PACKAGE / "models" / "engine").glob("*.py")])
LAZY = {"cli.py"}  # the command imports the server's modules when it runs (a fast `specrag --help`)
STDLIB_PRIVATE = {"argparse._SubParsersAction"}  # an annotation of argparse's own subparser type


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reach_ins(source: str) -> list[str]:
    """Private names ``source`` takes from other objects or modules (``self``/``cls`` members are its own)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            own |= isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "super"
            if not own and ast.unparse(node) not in STDLIB_PRIVATE:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
        ):
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda hit: int(hit.partition(":")[0]))


def hidden_imports(source: str) -> list[str]:
    """Imports of specrag_jax under ``if TYPE_CHECKING`` or inside a function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.append(f"{node.lineno}: if {ast.unparse(node.test)}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("specrag_jax"):
                    found.append(f"{inner.lineno}: from {inner.module} import ... in {node.name}()")
    return found


def test_no_private_reach_ins():
    offenders = [f"{p.name}:{hit}" for p in CHECKED for hit in reach_ins(p.read_text())]
    assert not offenders, offenders


def test_no_hidden_imports():
    offenders = [
        f"{p.name}:{hit}"
        for p in CHECKED
        if p.parent != SERVING or p.name not in LAZY
        for hit in hidden_imports(p.read_text())
    ]
    assert not offenders, offenders


def test_the_checks_see_what_they_look_for():
    assert reach_ins(
        "x = eng._state\nfrom m import _p\ngetattr(r, '_pool')\nself._ok = argparse._SubParsersAction\n"
    ) == ["1: eng._state", "2: from m import _p", "3: getattr(r, '_pool')"]
    assert len(hidden_imports("if TYPE_CHECKING:\n    import a\ndef f():\n    from specrag_jax.x import y\n")) == 2
