"""Dependencies run one way: tune -> bench -> load -> serving, reliability -> load -> serving;
handlers/ (shipped in every archive) and build/ import nothing from benchmarks/ or tests/."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from benchmarks.serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

WINGS = ("serving", "load", "bench", "tune", "reliability")
# What each wing may import besides itself (lazy imports inside functions count too).
MAY_IMPORT = {
    "serving": set(),
    "load": {"serving"},
    "bench": {"load", "serving"},
    "tune": {"bench", "load", "serving"},
    "reliability": {"load", "serving"},
}


def imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, module) of every import in a file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            # `from benchmarks import serving` names a wing as an attribute
            if node.module == "benchmarks":
                yield from ((node.lineno, f"benchmarks.{alias.name}") for alias in node.names)


def violations(folder: Path, allowed) -> list:
    out = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in imports(path):
            if not allowed(module):
                out.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {module}")
    return out


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "benchmarks" and len(parts) > 1 else None


@pytest.mark.parametrize("wing", WINGS)
def test_wing_imports_only_downwards(wing):
    def allowed(module: str) -> bool:
        if module.split(".")[0] == "tests":
            return False
        target = wing_of(module)
        return target is None and module != "benchmarks" or target in MAY_IMPORT[wing] | {wing}
    assert violations(REPO_ROOT / "benchmarks" / wing, allowed) == []


def test_every_module_belongs_to_a_wing():
    loose = [p.name for p in (REPO_ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], "benchmarks/ holds wings only: move these into one"
    assert {p.name for p in (REPO_ROOT / "benchmarks").iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == set(WINGS) | {"reports"}


@pytest.mark.parametrize("package", ["handlers", "build"])
def test_handlers_and_build_import_nothing_from_benchmarks_or_tests(package):
    def allowed(module: str) -> bool:
        return module.split(".")[0] not in ("benchmarks", "tests")
    assert violations(REPO_ROOT / package, allowed) == []
