"""The third-party modules a folder of the repository imports, found by reading its source: every
import at any depth (lazy ones inside functions too) and importlib.import_module("x")."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from serving.repo import REPO_ROOT

# The repository's own top-level packages.
PROJECT = frozenset({"handlers", "build", "models", "serving", "benchmarks", "deployment", "tests"})


def top_level_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every import in a file."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value.split(".")[0]


def third_party(module: str) -> bool:
    return module not in sys.stdlib_module_names and module not in PROJECT and module != "__future__"


def third_party_imports(folder: str) -> list[tuple[str, str]]:
    """(`path:line`, module) of each third-party import under REPO_ROOT/folder (reports excluded)."""
    return [(f"{path.relative_to(REPO_ROOT)}:{line}", module)
            for path in sorted((REPO_ROOT / folder).rglob("*.py"))
            if "reports" not in path.relative_to(REPO_ROOT).parts
            for line, module in top_level_imports(path) if third_party(module)]
