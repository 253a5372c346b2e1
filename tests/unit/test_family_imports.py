"""The families package imports without a circle: its own module imports no family, and each family
module imports first, alone, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

FAMILIES = sorted(p.stem for p in (Path(REPO_ROOT) / "handlers" / "families").glob("*.py") if p.stem != "__init__")


def test_the_package_imports_no_family():
    code = ("import sys, handlers.families\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('handlers.families.'))\n"
            "assert loaded == [], loaded\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_each_family_module_imports_first():
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    for m in [m for m in sys.modules if m.startswith('handlers')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module('handlers.families.' + name)\n")
    done = subprocess.run([sys.executable, "-c", code, *FAMILIES], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
