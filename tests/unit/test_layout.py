"""Dependencies run one way, and no package imports itself in a circle.

    handlers <- build <- serving <- benchmarks (load <- bench <- tune; load <- reliability) <- deployment

handlers/ ships inside every archive and imports nothing of the project outside itself; build/ may
use handlers/ (and models/, the training code the catalogue names); serving/, the package that
starts and drives TorchServe, may use both; the benchmark wings use serving/ and the wings below
them; nothing imports tests/.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

PROJECT = ("handlers", "build", "serving", "benchmarks", "deployment", "models", "tests")
# What each package may import of the project besides itself (lazy imports inside functions count too).
MAY_IMPORT = {
    "handlers": set(),
    "build": {"handlers", "models"},
    "serving": {"handlers", "build"},
    "deployment": {"handlers", "build", "serving", "benchmarks"},
}
WINGS = ("load", "bench", "tune", "reliability")
WING_MAY_IMPORT = {
    "load": set(),
    "bench": {"load"},
    "tune": {"bench", "load"},
    "reliability": {"load"},
}
BELOW_BENCHMARKS = {"handlers", "build", "serving", "models"}


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth; `from a import b` also yields a.b."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def violations(folder: Path, allowed) -> list:
    out = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in imports(path):
            if module.split(".")[0] in PROJECT and not allowed(module):
                out.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {module}")
    return sorted(set(out))


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_packages_import_only_downwards(package):
    def allowed(module: str) -> bool:
        return module.split(".")[0] in MAY_IMPORT[package] | {package}
    assert violations(REPO_ROOT / package, allowed) == []


@pytest.mark.parametrize("wing", WINGS)
def test_benchmark_wings_import_only_downwards(wing):
    def allowed(module: str) -> bool:
        parts = module.split(".")
        if parts[0] != "benchmarks":
            return parts[0] in BELOW_BENCHMARKS
        return len(parts) > 1 and parts[1] in WING_MAY_IMPORT[wing] | {wing}
    assert violations(REPO_ROOT / "benchmarks" / wing, allowed) == []


def test_benchmarks_holds_its_wings_only():
    loose = [p.name for p in (REPO_ROOT / "benchmarks").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert loose == [], "benchmarks/ holds wings and its one command only: move these into one"
    assert {p.name for p in (REPO_ROOT / "benchmarks").iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == set(WINGS) | {"reports"}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (a package's __init__ counts as a module)."""
    files = {module_of(p): p for p in (REPO_ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = {m for _, m in imports(path) if m in files and m != module}
        # `from pkg import name` where pkg.name is a module imports that module, not pkg's __init__.
        graph[module] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one module (Tarjan's algorithm), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", ["handlers", "build", "serving", "benchmarks", "deployment", "models"])
def test_no_import_circle_inside_a_package(package):
    assert cycles(import_graph(package)) == []


def test_the_circle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
