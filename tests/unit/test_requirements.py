"""The requirement files by role, checked against what the code imports (lazy imports included).

    requirements.txt          serving: what TorchServe's frontend and workers need (handlers/)
    requirements-build.txt    + building the archives and training the models (build/, models/, catalogue.yaml)
    requirements-dev.txt      + tests, benchmarks, serving/ and deployment/ tools, lint
    requirements-nodeps.txt   installed with --no-deps beside the build set (a catalogue package)

Every third-party module a folder imports must come from a distribution pinned in its role's files
(directly, not through another package's dependencies), and every pin is what this environment has.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from serving.repo import CATALOGUE, REPO_ROOT

pytestmark = pytest.mark.unit

SERVING = ("requirements.txt",)
BUILD = ("requirements-build.txt", "requirements-nodeps.txt")
DEV = ("requirements-dev.txt", "requirements-nodeps.txt")
ROLES = {
    "handlers": SERVING,
    "build": BUILD,
    "models": BUILD,
    "serving": DEV,
    "benchmarks": DEV,
    "deployment": DEV,
    "tests": DEV,
}
PROJECT = set(ROLES)
# Imported but never installed: a package the test writes into its temp folder.
NOT_INSTALLED = {"mine"}  # tests/e2e/test_own_model.py
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def pins(filename: str) -> dict[str, str]:
    """distribution -> pinned version, following `-r other.txt`."""
    found: dict[str, str] = {}
    for raw in (REPO_ROOT / filename).read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            found.update(pins(line[3:].strip()))
            continue
        match = _PIN.match(line)
        assert match, f"{filename}: {raw!r} is not pinned with =="
        found[normalised(match.group(1))] = match.group(2)
    return found


def role_pins(files: tuple[str, ...]) -> dict[str, str]:
    return {name: version for f in files for name, version in pins(f).items()}


def top_level_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every import at any depth, and of importlib.import_module("x")."""
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


def unpinned(where: str, modules: list[tuple[str, str]], files: tuple[str, ...]) -> list[str]:
    """`where: module (distribution)` for each module no distribution pinned in `files` provides."""
    allowed = set(role_pins(files))
    provides = importlib.metadata.packages_distributions()
    out = []
    for place, module in modules:
        if module in NOT_INSTALLED:
            continue
        dists = {normalised(d) for d in provides.get(module, ())}
        if not dists & allowed:
            out.append(f"{place}: {module} ({', '.join(sorted(dists)) or 'not installed'}) not in {' + '.join(files)}")
    return sorted(set(out))


@pytest.mark.parametrize("folder", sorted(ROLES))
def test_every_import_is_pinned_in_the_folders_role(folder):
    modules = [(f"{path.relative_to(REPO_ROOT)}:{line}", module)
               for path in sorted((REPO_ROOT / folder).rglob("*.py"))
               if "reports" not in path.relative_to(REPO_ROOT).parts
               for line, module in top_level_imports(path) if third_party(module)]
    assert modules, f"no third-party import found in {folder}/"
    problems = unpinned(folder, modules, ROLES[folder])
    assert not problems, "\n".join(problems)


def catalogue_packages(node: Any) -> Iterator[str]:
    """The installed packages catalogue.yaml names: `module:` sources and `package:` files."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("module", "package") and isinstance(value, str):
                yield value.split(".")[0]
            else:
                yield from catalogue_packages(value)
    elif isinstance(node, list):
        for item in node:
            yield from catalogue_packages(item)


def test_the_catalogues_packages_are_in_the_build_set():
    named = [("catalogue.yaml", m) for m in catalogue_packages(yaml.safe_load(CATALOGUE.read_text(encoding="utf-8")))]
    assert len(named) > 3
    problems = unpinned("catalogue.yaml", named, BUILD)
    assert not problems, "\n".join(problems)


def test_a_module_outside_the_role_is_reported():
    # matplotlib is pinned for dev only: the serving set must not satisfy it.
    assert unpinned("handlers/x.py:1", [("handlers/x.py:1", "matplotlib")], SERVING) \
        == ["handlers/x.py:1: matplotlib (matplotlib) not in requirements.txt"]


@pytest.mark.parametrize("filename", ["requirements.txt", "requirements-build.txt", "requirements-dev.txt",
                                      "requirements-nodeps.txt"])
def test_every_pin_is_the_installed_version(filename):
    for name, version in pins(filename).items():
        installed = importlib.metadata.version(name).split("+")[0]  # torch 2.13.0+cpu is torch==2.13.0
        assert installed == version, f"{filename}: {name}=={version}, installed {installed}"


def test_the_sets_nest_and_torch_stays_pinned():
    serving, build, dev = pins("requirements.txt"), pins("requirements-build.txt"), pins("requirements-dev.txt")
    assert serving.items() <= build.items() <= dev.items()
    assert serving["torch"] == "2.13.0"
    assert not {"pytest", "matplotlib", "scikit-learn", "torch-model-archiver"} & set(serving)
