"""The LN-LSTM package's imports run one way (issue 79): no loop among its modules, counting the imports
inside functions too, and no import inside a function but the optional Triton kernels'."""

from __future__ import annotations

import ast
from pathlib import Path

import asr.models.lnlstm

PACKAGE = Path(asr.models.lnlstm.__file__).parent
PREFIX = "asr.models.lnlstm"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join((PREFIX, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imports(path: Path, modules: set[str]) -> tuple[set[str], list[str]]:
    """The package modules ``path`` imports and the ones it imports inside a function. A module importing
    names from its own package's ``__init__`` counts: that ``__init__`` importing the module back is a loop
    (as ``backends/__init__.py`` and ``cpp.py`` once were)."""
    tree = ast.parse(path.read_text())
    inside = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn)}
    name = module_name(path)
    found, deferred = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                if id(node) in inside:
                    deferred.append(target)
    return found, deferred


def graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges, deferred = {}, {}
    for name, path in paths.items():
        edges[name], deferred[name] = imports(path, set(paths))
    return edges, deferred


def test_the_graph_sees_the_package():
    edges, _ = graph()
    assert f"{PREFIX}.selfcheck" in edges[f"{PREFIX}.cells"]
    assert f"{PREFIX}.backends.base" in edges[f"{PREFIX}.backends.cpp"]


def test_no_module_of_the_package_imports_itself_back():
    edges, _ = graph()

    def reachable(start: str) -> set[str]:
        seen, todo = set(), list(edges[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(edges.get(module, ()))
        return seen

    loops = sorted(name for name in edges if name in reachable(name))
    assert loops == []


def test_only_the_optional_triton_kernels_are_imported_inside_a_function():
    _, deferred = graph()
    inside = {name: targets for name, targets in deferred.items() if targets}
    assert inside == {f"{PREFIX}.backends.triton": [f"{PREFIX}.backends.triton_kernels"]}
