"""Fixtures shared by every tier: the repo, the real photos, the built archives (model_store is
built here when a test asks for it: tests/archives and tests/e2e, never tests/unit)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from serving.repo import MODEL_STORE, REPO_ROOT


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


def _skimage_photo(name: str) -> Path:
    import skimage

    path = Path(skimage.__file__).resolve().parent / "data" / name
    if not path.is_file():
        pytest.fail(f"{path} missing: scikit-image's wheel ships it; reinstall scikit-image")
    return path


@pytest.fixture(scope="session")
def cat_png() -> Path:
    """skimage's chelsea.png: a tabby cat (ImageNet 281-285)."""
    return _skimage_photo("chelsea.png")


@pytest.fixture(scope="session")
def coffee_png() -> Path:
    """skimage's coffee.png: a cup of espresso (ImageNet 967)."""
    return _skimage_photo("coffee.png")


@pytest.fixture(scope="session")
def photos(cat_png, coffee_png):
    """The two photos' bytes: {"cat": ..., "coffee": ...}."""
    return {"cat": cat_png.read_bytes(), "coffee": coffee_png.read_bytes()}


@pytest.fixture(scope="session")
def model_store() -> Path:
    """model_store/ with every catalogue archive built (`python -m build`, incremental), once."""
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "build"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"python -m build exited {proc.returncode}:\n{proc.stdout[-4000:]}", pytrace=False)
    print(f"\n[build] archives ready in {time.monotonic() - began:.1f} s", file=sys.stderr)
    return MODEL_STORE


_TIER_SECONDS: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown seconds, summed by tier (tests/<tier>/...)."""
    parts = report.nodeid.split("/")
    _TIER_SECONDS[parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"] += report.duration


def pytest_terminal_summary(terminalreporter):
    """Seconds per tier, so CI shows which one grows (a server's start counts where its first test is)."""
    if _TIER_SECONDS:
        terminalreporter.section("seconds per tier")
        for tier, seconds in sorted(_TIER_SECONDS.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{tier:<10} {seconds:8.1f} s")
